"""Every kernel (language) through the gateway, as an agent uses it: the seed demo's
four tasks with their exact answers, state between cells where the kernel keeps
it, an error with its message, a timeout that interrupts an endless loop (and
leaves the kernel and its state), a file reported as an artifact, a display
where the language has one, and a notebook export in the right language.

The images are built before the tests (scripts/test.sh: ``kernelgw image build
--kernel ...``); a missing one fails its tests with the command that builds it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import docker
import httpx
import pytest

from kernelgw.kernels import PROFILES
from tests.integration.conftest import RunningGateway, assert_nothing_left, gateway_settings, run, start_gateway
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

FIB = "0 1 1 2 3 5 8 13 21 34"


@dataclass(frozen=True)
class Case:
    """One language's cells (a compiled language's cells are whole programs)."""

    pi: str
    factorial: str
    fibonacci: str
    total: str
    error: str
    error_text: str
    """Found in the error's ename, evalue or traceback (or, for bash, its output)."""
    endless: str
    write_file: str
    """Writes "hi" to out.txt in the working directory."""
    state: tuple[str, str] | None = None
    """Two cells: the second prints 42 from what the first defined."""
    display: str | None = None
    display_mime: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


def go(body: str, imports: str = '"fmt"') -> str:
    return f"package main\n\nimport ({imports})\n\nfunc main() {{\n{body}\n}}\n"


def cpp(body: str) -> str:
    return f"#include <cstdio>\n#include <random>\n#include <fstream>\n\nint main() {{\n{body}\n}}\n"


CASES: dict[str, Case] = {
    "python3": Case(
        pi="import random\nr = random.Random(1)\nn = 200000\nc = sum(r.random()**2 + r.random()**2 <= 1 for _ in range(n))\n"
        "print(f'{4 * c / n:.2f}')",
        factorial="import math\nprint(math.factorial(10))",
        fibonacci="a, b, out = 0, 1, []\nfor _ in range(10):\n    out.append(a)\n    a, b = b, a + b\nprint(*out)",
        total="print(sum(range(1, 10001)))",
        error="raise ValueError('boom from python')",
        error_text="boom from python",
        endless="while True:\n    pass",
        write_file="open('out.txt', 'w').write('hi')",
        state=("kept = 41", "print(kept + 1)"),
        display="import pandas as pd\npd.DataFrame({'a': [1, 2]})",
        display_mime="text/html",
    ),
    "deno": Case(
        pi="let inside = 0;\nconst n = 200000;\nfor (let i = 0; i < n; i++) {\n  const x = Math.random(), y = Math.random();\n"
        "  if (x * x + y * y <= 1) inside++;\n}\nconsole.log((4 * inside / n).toFixed(2));",
        factorial="let f: bigint = 1n;\nfor (let i = 1n; i <= 10n; i++) f *= i;\nconsole.log(f.toString());",
        fibonacci="const fib: number[] = [0, 1];\nwhile (fib.length < 10) fib.push(fib[fib.length - 1] + fib[fib.length - 2]);\n"
        'console.log(fib.join(" "));',
        total="let s = 0;\nfor (let i = 1; i <= 10000; i++) s += i;\nconsole.log(s);",
        error='throw new Error("boom from deno");',
        error_text="boom from deno",
        endless="while (true) {}",
        write_file='Deno.writeTextFileSync("out.txt", "hi");',
        state=("const kept: number = 41;", "console.log(kept + 1);"),
        display="Deno.jupyter.html`<b>bold</b>`",
        display_mime="text/html",
    ),
    "ir": Case(
        pi='set.seed(1)\nn <- 200000\nx <- runif(n)\ny <- runif(n)\ncat(sprintf("%.2f\\n", 4 * mean(x^2 + y^2 <= 1)))',
        factorial='cat(sprintf("%d\\n", as.integer(factorial(10))))',
        fibonacci="f <- numeric(10)\nf[2] <- 1\nfor (i in 3:10) f[i] <- f[i - 1] + f[i - 2]\ncat(f, sep = ' ')\ncat('\\n')",
        total='cat(sum(1:10000), "\\n")',
        error='stop("boom from R")',
        error_text="boom from R",
        endless="while (TRUE) {}",
        write_file='writeLines("hi", "out.txt")',
        state=("kept <- 41", 'cat(kept + 1, "\\n")'),
        display="plot(1:10)",
        display_mime="image/png",
    ),
    "bash": Case(
        pi="awk 'BEGIN { srand(1); n = 200000; for (i = 0; i < n; i++) { x = rand(); y = rand(); "
        'if (x * x + y * y <= 1) c++ } printf "%.2f\\n", 4 * c / n }\'',
        factorial="f=1; for i in $(seq 1 10); do f=$((f * i)); done; echo $f",
        fibonacci="a=0; b=1; out=(); for i in $(seq 1 10); do out+=($a); t=$((a + b)); a=$b; b=$t; done; "
        'echo "${out[*]}"',
        total="s=0; for i in $(seq 1 10000); do s=$((s + i)); done; echo $s",
        error="ls /boom-from-bash",
        error_text="boom-from-bash",
        endless="while true; do :; done",
        write_file="echo hi > out.txt",
        state=("kept=41", "echo $((kept + 1))"),
    ),
    "java": Case(
        pi="java.util.Random r = new java.util.Random(1);\nint n = 200000, c = 0;\nfor (int i = 0; i < n; i++) {\n"
        "    double x = r.nextDouble(), y = r.nextDouble();\n    if (x * x + y * y <= 1) c++;\n}\n"
        'System.out.printf("%.2f%n", 4.0 * c / n);',
        factorial="long f = 1;\nfor (int i = 1; i <= 10; i++) f *= i;\nSystem.out.println(f);",
        fibonacci="long[] fib = new long[10];\nfib[1] = 1;\nfor (int i = 2; i < 10; i++) fib[i] = fib[i - 1] + fib[i - 2];\n"
        'StringBuilder sb = new StringBuilder();\nfor (int i = 0; i < 10; i++) sb.append(i == 0 ? "" : " ").append(fib[i]);\n'
        "System.out.println(sb);",
        total="long s = 0;\nfor (int i = 1; i <= 10000; i++) s += i;\nSystem.out.println(s);",
        error='throw new IllegalStateException("boom from java");',
        error_text="boom from java",
        endless="while (true) {}",
        write_file='java.nio.file.Files.writeString(java.nio.file.Path.of("out.txt"), "hi");',
        state=("int kept = 41;", "System.out.println(kept + 1);"),
        display='display("<b>bold</b>", "text/html");',
        display_mime="text/html",
    ),
    "go": Case(
        pi=go(
            "\tr := rand.New(rand.NewSource(1))\n\tn, c := 200000, 0\n\tfor i := 0; i < n; i++ {\n"
            "\t\tx, y := r.Float64(), r.Float64()\n\t\tif x*x+y*y <= 1 {\n\t\t\tc++\n\t\t}\n\t}\n"
            '\tfmt.Printf("%.2f\\n", 4*float64(c)/float64(n))',
            '"fmt"; "math/rand"',
        ),
        factorial=go("\tf := 1\n\tfor i := 1; i <= 10; i++ {\n\t\tf *= i\n\t}\n\tfmt.Println(f)"),
        fibonacci=go(
            "\ta, b := 0, 1\n\tout := []string{}\n\tfor i := 0; i < 10; i++ {\n\t\tout = append(out, fmt.Sprint(a))\n"
            '\t\ta, b = b, a+b\n\t}\n\tfmt.Println(strings.Join(out, " "))',
            '"fmt"; "strings"',
        ),
        total=go("\ts := 0\n\tfor i := 1; i <= 10000; i++ {\n\t\ts += i\n\t}\n\tfmt.Println(s)"),
        error=go("\tboomFromGo()", ""),
        error_text="boomFromGo",
        endless=go("\tfor {\n\t}", ""),
        write_file=go('\tos.WriteFile("out.txt", []byte("hi"), 0o644)', '"os"'),
    ),
    "cpp": Case(
        pi=cpp(
            "    std::mt19937 g(1);\n    std::uniform_real_distribution<double> u(0, 1);\n    int n = 200000, c = 0;\n"
            "    for (int i = 0; i < n; i++) { double x = u(g), y = u(g); if (x * x + y * y <= 1) c++; }\n"
            '    std::printf("%.2f\\n", 4.0 * c / n);'
        ),
        factorial=cpp('    long f = 1;\n    for (int i = 1; i <= 10; i++) f *= i;\n    std::printf("%ld\\n", f);'),
        fibonacci=cpp(
            "    long a = 0, b = 1;\n    for (int i = 0; i < 10; i++) {\n"
            '        std::printf(i ? " %ld" : "%ld", a);\n        long t = a + b; a = b; b = t;\n    }\n'
            '    std::printf("\\n");'
        ),
        total=cpp('    long s = 0;\n    for (int i = 1; i <= 10000; i++) s += i;\n    std::printf("%ld\\n", s);'),
        error=cpp("    boom_from_cpp();"),
        error_text="boom_from_cpp",
        endless=cpp("    for (;;) {}"),
        write_file=cpp('    std::ofstream("out.txt") << "hi";'),
    ),
    "ruby": Case(
        pi="r = Random.new(1)\nn = 200000\nc = n.times.count { x, y = r.rand, r.rand; x * x + y * y <= 1 }\n"
        'puts format("%.2f", 4.0 * c / n)',
        factorial="puts (1..10).reduce(:*)",
        fibonacci='a, b = 0, 1\nout = []\n10.times { out << a; a, b = b, a + b }\nputs out.join(" ")',
        total="puts (1..10000).sum",
        error='raise ArgumentError, "boom from ruby"',
        error_text="boom from ruby",
        endless="loop {}",
        write_file='File.write("out.txt", "hi")',
        state=("kept = 41", "puts kept + 1"),
        display="IRuby.table([{a: 1, b: 2}])",
        display_mime="text/html",
    ),
}
assert set(CASES) == set(PROFILES)

LANGUAGES = [name for name in CASES if name != "python3"]
"""Python's own behaviour is tested everywhere else; its case here checks the table."""


@pytest.fixture(scope="module")
def polyglot(docker_client: docker.DockerClient) -> Iterator[RunningGateway]:
    images = {
        name: os.environ[f"KERNELGW_IMAGE_{name.upper()}"]
        for name in CASES
        if f"KERNELGW_IMAGE_{name.upper()}" in os.environ
    }
    gw = start_gateway(
        gateway_settings(
            gateway_name=f"t{os.getpid()}-lang", kernels=list(CASES), kernel_images=images, package_allowlist=["sympy"]
        )
    )
    yield gw
    gw.stop()
    assert_nothing_left(docker_client, gw.settings.gateway_name)


@pytest.fixture(scope="module")
def lang_http(polyglot: RunningGateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=polyglot.url, timeout=180) as client:
        yield client


def create(http: httpx.Client, kernel: str) -> str:
    resp = http.post("/v1/sessions", json={"kernel": kernel})
    assert resp.status_code == 201, (
        f"{kernel}: {resp.status_code} {resp.text}; build its image with `kernelgw image build --kernel {kernel}`"
    )
    body = resp.json()
    assert body["kernel"] == kernel
    return str(body["id"])


def done(result: dict[str, object]) -> dict[str, object]:
    events = result["events"]
    assert isinstance(events, list)
    last: dict[str, object] = events[-1]
    assert last["type"] == "done"
    return last


def out(result: dict[str, object]) -> str:
    events = result["events"]
    assert isinstance(events, list)
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == "stdout")


def ok(http: httpx.Client, sid: str, code: str, kernel: str) -> str:
    result = run(http, sid, code)
    assert done(result)["status"] == "ok", f"{kernel}: {code!r} gave {result['events']}"
    return out(result)


@pytest.fixture
def session(lang_http: httpx.Client, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    kernel = request.param
    sid = create(lang_http, kernel)
    yield kernel, sid
    lang_http.delete(f"/v1/sessions/{sid}")


@pytest.mark.parametrize("session", list(CASES), indirect=True)
def test_the_demo_tasks_give_their_exact_answers(lang_http: httpx.Client, session: tuple[str, str]) -> None:
    kernel, sid = session
    case = CASES[kernel]
    assert 3.0 <= float(ok(lang_http, sid, case.pi, kernel).strip()) <= 3.3
    assert ok(lang_http, sid, case.factorial, kernel).strip() == "3628800"
    assert ok(lang_http, sid, case.fibonacci, kernel).strip() == FIB
    assert ok(lang_http, sid, case.total, kernel).strip() == "50005000"


@pytest.mark.parametrize("session", LANGUAGES, indirect=True)
def test_state_errors_interrupts_files_and_displays(lang_http: httpx.Client, session: tuple[str, str]) -> None:
    kernel, sid = session
    case = CASES[kernel]
    if case.state is not None:
        ok(lang_http, sid, case.state[0], kernel)
        assert ok(lang_http, sid, case.state[1], kernel).strip() == "42"

    failed = run(lang_http, sid, case.error)
    assert done(failed)["status"] == "error", failed
    errors = [e for e in failed["events"] if e["type"] == "error"]
    seen = " ".join(f"{e['ename']} {e['evalue']} {' '.join(e['traceback'])}" for e in errors)
    if kernel == "bash":  # bash_kernel reports the exit status; the message is on the streams
        seen += " ".join(e.get("text", "") for e in failed["events"] if e["type"] == "stream")
    assert case.error_text in seen, failed

    timed_out = run(lang_http, sid, case.endless, timeout=3)
    end = done(timed_out)
    assert end["status"] == "timeout", timed_out
    assert end["state_lost"] is False, f"{kernel}: the interrupt did not stop the loop, the kernel was restarted: {end}"
    if case.state is not None:
        assert ok(lang_http, sid, case.state[1], kernel).strip() == "42"
    assert ok(lang_http, sid, case.total, kernel).strip() == "50005000"

    wrote = run(lang_http, sid, case.write_file)
    assert done(wrote)["status"] == "ok", wrote
    assert [(a["path"], a["size"]) for a in done(wrote)["artifacts"]] in ([("out.txt", 2)], [("out.txt", 3)])
    assert lang_http.get(f"/v1/sessions/{sid}/files/out.txt").content.strip() == b"hi"

    if case.display is not None:
        shown = run(lang_http, sid, case.display)
        assert done(shown)["status"] == "ok", shown
        mimes = {m for e in shown["events"] if e["type"] in ("display", "result") for m in e["data"]}
        assert case.display_mime in mimes, shown

    notebook = lang_http.get(f"/v1/sessions/{sid}/notebook").json()
    assert notebook["metadata"]["kernelspec"]["name"] == kernel
    assert notebook["metadata"]["language_info"]["name"].lower() in (
        PROFILES[kernel].language.lower(),
        {"deno": "typescript", "cpp": "c++"}.get(kernel, PROFILES[kernel].language).lower(),
    )


@pytest.mark.parametrize("session", LANGUAGES, indirect=True)
def test_an_interrupt_on_request_ends_the_cell_as_interrupted(
    lang_http: httpx.Client, session: tuple[str, str]
) -> None:
    """POST .../interrupt, as a user's stop button: every kernel's cell ends as
    ``interrupted`` (not failed), whatever the kernel calls it, and the kernel
    goes on."""
    kernel, sid = session
    case = CASES[kernel]
    result: dict[str, dict[str, object]] = {}
    worker = threading.Thread(target=lambda: result.update(r=run(lang_http, sid, case.endless)))
    worker.start()
    wait_until(lambda: lang_http.get(f"/v1/sessions/{sid}").json()["state"] == "busy", "the cell running")
    # as a user presses stop again: an interrupt that lands while the kernel is
    # still compiling the cell (JShell, more so under gVisor) stops nothing, and
    # the loop that starts after it runs on; the next press stops it
    for _ in range(20):
        assert lang_http.post(f"/v1/sessions/{sid}/interrupt").status_code in (200, 202, 204)
        worker.join(3)
        if not worker.is_alive():
            break
    worker.join(60)
    end = done(result["r"])
    assert end["status"] == "interrupted" and end["state_lost"] is False, end
    assert ok(lang_http, sid, case.total, kernel).strip() == "50005000"


def test_the_gateway_lists_its_kernels_and_refuses_what_only_python_does(
    lang_http: httpx.Client, polyglot: RunningGateway, docker_client: docker.DockerClient
) -> None:
    # no image declares a volume: each kernel container would get an anonymous one,
    # left on the engine (a committed build container's mount point once did)
    for name in CASES:
        config = docker_client.images.get(polyglot.settings.kernel_image(name)).attrs["Config"]
        assert not config.get("Volumes"), (name, config.get("Volumes"))
    kernels = {k["name"]: k for k in lang_http.get("/v1/kernels").json()["kernels"]}
    assert list(kernels) == list(CASES)
    assert kernels["python3"]["default"] and not kernels["ruby"]["default"]
    assert kernels["go"]["keeps_state"] is False and kernels["ruby"]["keeps_state"] is True
    assert kernels["python3"]["packages"] and not kernels["ruby"]["packages"]
    assert all(k["available"] for k in kernels.values()), kernels

    resp = lang_http.post("/v1/sessions", json={"kernel": "cobol"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "kernel_not_offered"
    assert "ruby" in resp.json()["error"]["message"]

    sid = create(lang_http, "ruby")
    try:
        resp = lang_http.post(f"/v1/sessions/{sid}/packages", json={"packages": ["sympy"]})
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "not_for_this_kernel", resp.text
        resp = lang_http.post(f"/v1/sessions/{sid}/pause")
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "not_for_this_kernel", resp.text
        ok(lang_http, sid, "kept = 41", "ruby")
        # a fork runs the same kernel, its state replayed
        fork = lang_http.post("/v1/sessions", json={"from": sid})
        assert fork.status_code == 201, fork.text
        assert fork.json()["kernel"] == "ruby"
        try:
            assert ok(lang_http, fork.json()["id"], "puts kept + 1", "ruby").strip() == "42"
        finally:
            lang_http.delete(f"/v1/sessions/{fork.json()['id']}")
        wrong = lang_http.post("/v1/sessions", json={"from": sid, "kernel": "go"})
        assert wrong.status_code == 400 and "ruby" in wrong.json()["error"]["message"]
    finally:
        lang_http.delete(f"/v1/sessions/{sid}")

    specs = lang_http.get("/api/kernelspecs").json()
    assert specs["default"] == "python3" and set(specs["kernelspecs"]) == set(CASES)
    assert specs["kernelspecs"]["ir"]["spec"]["language"] == "R"
    started = lang_http.post("/api/kernels", json={"name": "ruby"})
    assert started.status_code == 201, started.text
    assert started.json()["name"] == "ruby"
    assert lang_http.delete(f"/api/kernels/{started.json()['id']}").status_code == 204
