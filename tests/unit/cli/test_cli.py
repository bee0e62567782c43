"""The CLI's argument parsing and help; nothing here needs a gateway."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from types import SimpleNamespace

from click.testing import CliRunner

from kernelgw.cli.main import _Printer, main


def invoke(*args: str, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


def test_main_help_lists_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("serve", "image", "run"):
        assert command in result.output


def test_serve_help():
    result = invoke("serve", "--help")
    assert result.exit_code == 0
    for option in ("--host", "--port", "--config"):
        assert option in result.output


def test_serve_rejects_a_missing_config_file(tmp_path):
    result = invoke("serve", "--config", str(tmp_path / "missing.toml"))
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_serve_rejects_a_non_integer_port():
    result = invoke("serve", "--port", "eighty")
    assert result.exit_code == 2


def test_image_build_help():
    result = invoke("image", "build", "--help")
    assert result.exit_code == 0
    for option in ("--tag", "--base", "--force", "kernelgw/python:latest"):
        assert option in result.output


def test_run_help():
    result = invoke("run", "--help")
    assert result.exit_code == 0
    for option in ("--server", "--session", "--timeout", "--save-images", "--no-save-images", "--keep", "KERNELGW_URL"):
        assert option in result.output


def test_run_rejects_a_bad_timeout():
    result = invoke("run", "1", "--timeout", "soon")
    assert result.exit_code == 2
    assert "--timeout" in result.output


def test_run_rejects_a_non_http_server_url():
    result = invoke("run", "1", "--server", "ftp://example.com")
    assert result.exit_code == 2
    assert "--server" in result.output


def test_run_takes_the_server_from_the_environment():
    result = invoke("run", "1", env={"KERNELGW_URL": "not a url"})
    assert result.exit_code == 2
    assert "--server" in result.output


def test_printer_writes_streams_results_errors_and_saves_images(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    printer = _Printer(tmp_path, out=out, err=err)
    png = b"\x89PNG\r\n\x1a\nfake"

    def event(type_, **fields):
        return SimpleNamespace(type=type_, execution_id="e1", **fields)

    printer.event(event("stream", name="stdout", text="hello\n"))
    printer.event(event("stream", name="stderr", text="warn\n"))
    printer.event(event("display", data={"image/png": base64.b64encode(png).decode(), "text/plain": "<Figure>"}))
    printer.event(event("result", data={"text/plain": "42"}))
    printer.event(event("error", traceback_text=["Traceback", "ValueError: x"]))
    saved = tmp_path / "e1-1.png"
    assert saved.read_bytes() == png
    assert out.getvalue() == f"hello\n[image saved: {saved}]\n42\n"
    assert err.getvalue() == "warn\nTraceback\nValueError: x\n"


def test_printer_without_save_dir_prints_text_plain():
    out = io.StringIO()
    printer = _Printer(None, out=out, err=io.StringIO())
    printer.event(
        SimpleNamespace(type="display", execution_id="e", data={"image/png": "AAAA", "text/plain": "<Figure>"})
    )
    printer.event(SimpleNamespace(type="display", execution_id="e", data={"image/png": "AAAA"}))
    assert out.getvalue() == "<Figure>\n[image/png; use --save-images DIR to keep it]\n"


def test_serve_options_override_env_which_overrides_the_config_file(monkeypatch, tmp_path):
    import sys
    from types import ModuleType

    seen = {}
    fake_app = ModuleType("kernelgw.server.app")
    fake_app.create_app = lambda settings=None, **options: seen.setdefault("settings", settings) or "APP"
    monkeypatch.setitem(sys.modules, "kernelgw.server.app", fake_app)
    from kernelgw.server.serving import DrainingServer

    monkeypatch.setattr(DrainingServer, "run", lambda self: seen.update(run=(self.config.host, self.config.port)))

    config = tmp_path / "kgw.toml"
    config.write_text(
        'host = "10.0.0.1"\nport = 9000\nmax_sessions = 7\nidle_timeout_s = 60.0\n'
        "allow_remote_without_auth = true\n"  # no keys in this data dir: needed off loopback
    )
    env = {"KERNELGW_PORT": "9100", "KERNELGW_MAX_SESSIONS": "8", "KERNELGW_DATA_DIR": str(tmp_path)}
    result = invoke("serve", "--config", str(config), "--port", "9200", env=env)
    assert result.exit_code == 0, result.output
    settings = seen["settings"]
    assert settings.port == 9200  # option beats env
    assert settings.max_sessions == 8  # env beats file
    assert settings.host == "10.0.0.1" and settings.idle_timeout_s == 60.0  # file
    assert seen["run"] == ("10.0.0.1", 9200)


def test_serve_reports_invalid_settings(monkeypatch, tmp_path):
    config = tmp_path / "kgw.json"
    config.write_text('{"memory_mb": 99999, "max_memory_mb": 10}')
    result = invoke("serve", "--config", str(config))
    assert result.exit_code == 1
    assert "invalid settings" in result.output


def test_image_build_prints_a_summary(monkeypatch):
    import sys
    from types import ModuleType

    calls = []

    def build_image(tag, base, force, console):
        calls.append((tag, base, force))
        return SimpleNamespace(tag=tag, image_id="sha256:abc", built=force, seconds=12.34)

    def build_kernel_image(name, tag, python_image, force, console):
        calls.append((name, tag, python_image, force))
        return SimpleNamespace(tag=tag or f"kernelgw/{name}:latest", image_id="sha256:def", built=True, seconds=3.0)

    def build_bundle_image(name, tag, python_image, force, console):
        calls.append(("bundle", name, tag, python_image, force))
        return SimpleNamespace(tag=tag or f"kernelgw/{name}:latest", image_id="sha256:fed", built=False, seconds=1.0)

    fake = ModuleType("kernelgw.image")
    fake.build_image = build_image
    fake.build_kernel_image = build_kernel_image
    fake.build_bundle_image = build_bundle_image
    monkeypatch.setitem(sys.modules, "kernelgw.image", fake)

    result = invoke("image", "build", "--kernel", "deno", "--kernel", "ruby", "--kernel", "code-interpreter")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "built kernelgw/deno:latest (sha256:def) in 3.0s\nbuilt kernelgw/ruby:latest (sha256:def) in 3.0s\n"
        "kernelgw/code-interpreter:latest is up to date (sha256:fed); --force rebuilds it\n"
    )
    assert calls[-1] == ("bundle", "code-interpreter", None, "kernelgw/python:latest", False)
    result = invoke("image", "build", "--kernel", "cobol")
    assert result.exit_code == 2 and "unknown kernel 'cobol'" in result.output
    result = invoke("image", "build", "--kernel", "go", "--kernel", "cpp", "--tag", "x:1")
    assert result.exit_code == 2 and "--tag names one image" in result.output
    calls.clear()

    result = invoke("image", "build", "--tag", "me/py:1", "--base", "debootstrap", "--force")
    assert result.exit_code == 0, result.output
    assert result.stdout == "built me/py:1 (sha256:abc) in 12.3s\n"
    result = invoke("image", "build")
    assert "kernelgw/python:latest is up to date (sha256:abc)" in result.stdout
    assert calls == [("me/py:1", "debootstrap", True), ("kernelgw/python:latest", "auto", False)]


def test_export_help_and_unreachable_gateway(tmp_path):
    result = invoke("export", "--help")
    assert result.exit_code == 0
    for option in ("SESSION", "--output", "--server"):
        assert option in result.output
    result = invoke("export", "abc", "-o", str(tmp_path / "x.ipynb"), "--server", "http://127.0.0.1:9")
    assert result.exit_code == 3 and "cannot reach the gateway" in result.output
    assert not (tmp_path / "x.ipynb").exists()


PNG = b"\x89PNG\r\n\x1a\nchart"


class _FakeSession:
    """Streams one chart and a done event, like a session running plt.plot."""

    id = "s1"

    def stream(self, source, timeout=None):
        chart = {"image/png": base64.b64encode(PNG).decode(), "text/plain": "<Figure size 640x480 with 1 Axes>"}
        yield SimpleNamespace(type="display", execution_id="e1", data=chart)
        yield SimpleNamespace(type="done", status="ok", reason=None, state_lost=False, artifacts=[])

    def delete(self, missing_ok=False):
        pass


class _FakeClient:
    def __init__(self, server):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def create_session(self, kernel=None):
        return _FakeSession()


def _run_chart(monkeypatch, *args: str):
    import kernelgw.client

    monkeypatch.setattr(kernelgw.client, "Client", _FakeClient)
    return CliRunner().invoke(main, ["run", "plot()", *args])


def test_run_saves_images_next_to_where_it_runs_by_default(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    result = _run_chart(monkeypatch)
    assert result.exit_code == 0, result.output
    saved = Path("kernelgw-images") / "e1-1.png"
    assert (tmp_path / saved).read_bytes() == PNG
    assert result.stdout == f"[image saved: {saved}]\n"
    # a second run never replaces the first one's image
    result = _run_chart(monkeypatch)
    assert result.stdout == f"[image saved: {Path('kernelgw-images') / 'e1-1-2.png'}]\n"
    assert (tmp_path / saved).read_bytes() == PNG
    assert (tmp_path / "kernelgw-images" / "e1-1-2.png").read_bytes() == PNG


def test_run_save_images_dir_and_no_save_images(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    result = _run_chart(monkeypatch, "--save-images", "charts")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "charts" / "e1-1.png").read_bytes() == PNG
    result = _run_chart(monkeypatch, "--no-save-images")
    assert result.exit_code == 0, result.output
    assert result.stdout == "<Figure size 640x480 with 1 Axes>\n"
    assert not (tmp_path / "kernelgw-images").exists()
    result = _run_chart(monkeypatch, "--no-save-images", "--save-images", "charts")
    assert result.exit_code == 2 and "contradict" in result.output


def test_printer_makes_the_directory_only_for_an_image(tmp_path):
    printer = _Printer(tmp_path / "images", out=io.StringIO(), err=io.StringIO())
    printer.event(SimpleNamespace(type="result", execution_id="e", data={"text/plain": "2"}))
    assert not (tmp_path / "images").exists()


def test_printer_falls_back_to_text_when_the_image_cannot_be_saved(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    out, err = io.StringIO(), io.StringIO()
    printer = _Printer(blocked, out=out, err=err)
    printer.event(
        SimpleNamespace(type="display", execution_id="e", data={"image/png": "AAAA", "text/plain": "<Figure>"})
    )
    assert out.getvalue() == "<Figure>\n" and err.getvalue().startswith("[image not saved: ")


def test_serve_log_format_option_and_default(monkeypatch, tmp_path):
    import sys
    from types import ModuleType

    from kernelgw import logs

    formats = []
    fake_app = ModuleType("kernelgw.server.app")
    fake_app.create_app = lambda settings=None, **options: "APP"
    monkeypatch.setitem(sys.modules, "kernelgw.server.app", fake_app)
    from kernelgw.server.serving import DrainingServer

    monkeypatch.setattr(DrainingServer, "run", lambda self: None)
    monkeypatch.setattr(logs, "configure", lambda fmt="auto", **kw: formats.append(fmt))
    env = {"KERNELGW_DATA_DIR": str(tmp_path)}
    assert invoke("serve", env=env).exit_code == 0
    assert invoke("serve", "--log-format", "text", env=env).exit_code == 0
    assert invoke("serve", env={**env, "KERNELGW_LOG_FORMAT": "json"}).exit_code == 0
    assert formats == ["auto", "text", "json"]
    assert invoke("serve", "--log-format", "xml", env=env).exit_code == 2
