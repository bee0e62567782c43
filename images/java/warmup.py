"""Build-time check and class-data archive of the Java kernel.

Run by install.sh (as the kernel's user, no network): starts JJava with the
image's JVM options and ``-XX:ArchiveClassesAtExit=ARCHIVE``, runs cells of
the kinds users run (statements, expressions, methods, records, generics,
streams, an exception), checks their results, and ends the JVM with SIGTERM,
on which it writes the archive: the classes it loaded (JJava's, JShell's,
javac's), which later kernels map instead of loading and verifying them.

    python warmup.py ARCHIVE -- JAVA_COMMAND...   ({connection_file} in it)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient

CELLS: list[tuple[str, str, str]] = [
    # (code, what to check: stdout / result / error, expected)
    ("System.out.println(6 * 7);", "stdout", "42\n"),
    ("int x = 41;\nx + 1", "result", "42"),
    ("long fact(int n) { return n <= 1 ? 1 : n * fact(n - 1); }\nfact(10)", "result", "3628800"),
    (
        "import java.util.*;\nimport java.util.stream.*;\n"
        "List<Integer> xs = IntStream.rangeClosed(1, 10000).boxed().collect(Collectors.toList());\n"
        "xs.stream().mapToLong(Integer::longValue).sum()",
        "result",
        "50005000",
    ),
    ("record Point(int x, int y) {}\nnew Point(3, 4)", "result", "Point[x=3, y=4]"),
    (
        "Map<String, Integer> counts = new TreeMap<>();\n"
        'for (String w : "a b a c b a".split(" ")) counts.merge(w, 1, Integer::sum);\n'
        "counts",
        "result",
        "{a=3, b=2, c=1}",
    ),
    ('String.format("%.4f", Math.PI)', "result", "3.1416"),
    (
        "var r = new java.util.Random(1);\nint inside = 0;\n"
        "for (int i = 0; i < 100000; i++) { double a = r.nextDouble(), b = r.nextDouble(); if (a * a + b * b <= 1) inside++; }\n"
        'System.out.printf("%.1f%n", 4.0 * inside / 100000);',
        "stdout",
        "3.1\n",
    ),
    ('class Greeter { String hi(String n) { return "hi " + n; } }\nnew Greeter().hi("you")', "result", "hi you"),
    ('throw new IllegalStateException("boom");', "error", "boom"),
    ('System.err.println("warn");\nx * 2', "result", "82"),
]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run(kc: BlockingKernelClient, code: str) -> tuple[dict[str, Any], str, list[str], list[dict[str, Any]]]:
    msg_id = kc.execute(code, allow_stdin=False)
    stdout, results, errors = "", [], []
    reply: dict[str, Any] | None = None
    idle = False
    deadline = time.monotonic() + 120
    while (reply is None or not idle) and time.monotonic() < deadline:
        if reply is None:
            try:
                msg = kc.get_shell_msg(timeout=0.05)
                if msg["parent_header"].get("msg_id") == msg_id:
                    reply = msg["content"]
            except Exception:
                pass
        try:
            msg = kc.get_iopub_msg(timeout=0.05)
        except Exception:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content["name"] == "stdout":
            stdout += content["text"]
        elif kind in ("execute_result", "display_data"):
            results.append(content["data"].get("text/plain", ""))
        elif kind == "error":
            errors.append(content)
        elif kind == "status" and content["execution_state"] == "idle":
            idle = True
    if reply is None:
        raise SystemExit(f"warm-up: no reply to {code!r}")
    return reply, stdout, results, errors


def main() -> None:
    archive, sep, *command = sys.argv[1:]
    assert sep == "--" and command, __doc__
    work = tempfile.mkdtemp(prefix="jjava-warmup-")
    key = os.urandom(16).hex()
    ports = free_ports(5)
    info = {
        "transport": "tcp",
        "ip": "127.0.0.1",
        "key": key,
        "signature_scheme": "hmac-sha256",
        "kernel_name": "java",
        **{f"{ch}_port": p for ch, p in zip(("shell", "iopub", "stdin", "control", "hb"), ports, strict=True)},
    }
    conn = os.path.join(work, "kernel.json")
    with open(conn, "w") as f:
        json.dump(info, f)
    argv = [a.replace("{connection_file}", conn) for a in command]
    argv.insert(1, f"-XX:ArchiveClassesAtExit={archive}")
    t0 = time.monotonic()
    kernel = subprocess.Popen(argv, cwd=work)
    kc = BlockingKernelClient()
    kc.load_connection_info(info)  # type: ignore[arg-type]  # a plain dict, as json.load gives
    kc.start_channels()
    try:
        ready = False
        while time.monotonic() - t0 < 120 and kernel.poll() is None:
            kc.kernel_info()
            try:
                kc.get_shell_msg(timeout=0.5)
                ready = True
                break
            except Exception:
                pass
        if not ready:
            raise SystemExit(f"warm-up: JJava did not answer (exit {kernel.poll()})")
        print(f"warm-up: JJava ready in {time.monotonic() - t0:.1f} s", flush=True)
        # iopub connected: a kernel_info's status comes through
        while True:
            kc.kernel_info()
            try:
                kc.get_iopub_msg(timeout=0.5)
                break
            except Exception:
                if time.monotonic() - t0 > 120:
                    raise SystemExit("warm-up: no iopub message from JJava") from None
        for code, kind, expected in CELLS:
            reply, stdout, results, errors = run(kc, code)
            got = {"stdout": stdout, "result": results[-1] if results else "", "error": ""}
            if kind == "error":
                got["error"] = errors[0]["evalue"] if errors else ""
                ok = reply["status"] == "error" and expected in got["error"]
            else:
                ok = reply["status"] == "ok" and got[kind] == expected
            if not ok:
                raise SystemExit(f"warm-up: {code!r} gave {reply.get('status')} {got}, expected {kind} {expected!r}")
        print(f"warm-up: {len(CELLS)} cells as expected", flush=True)
    finally:
        kc.stop_channels()
        kernel.send_signal(signal.SIGTERM)  # the JVM writes the archive as it exits
        try:
            kernel.wait(120)
        except subprocess.TimeoutExpired:
            kernel.kill()
            raise SystemExit("warm-up: JJava did not exit on SIGTERM") from None
    if not os.path.getsize(archive):
        raise SystemExit("warm-up: no class-data archive written")
    print(f"warm-up: archive of {os.path.getsize(archive) / 1e6:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
