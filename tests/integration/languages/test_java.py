"""The Java kernel (JJava on OpenJDK 17) in its image, behind the shim, started
by the gateway's backend with the gateway's options (512 MB, one CPU).

Image: KERNELGW_IMAGE_JAVA (default kernelgw/java:latest), built with
`kernelgw image build --kernel java`.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import pytest

from tests.integration.languages import Kernel, image_for, p50, require_image, start_kernel

pytestmark = pytest.mark.integration

IMAGE = image_for("java")


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    require_image(IMAGE, "java")
    with start_kernel(IMAGE) as started:
        print(f"\njava: ready {started.ready_s:.2f} s after the container's start")
        yield started.kernel


def test_agent_demo_tasks(kernel: Kernel) -> None:
    pi = kernel.execute(
        "var random = new java.util.Random();\n"
        "int inside = 0, n = 200_000;\n"
        "for (int i = 0; i < n; i++) {\n"
        "    double x = random.nextDouble(), y = random.nextDouble();\n"
        "    if (x * x + y * y <= 1) inside++;\n"
        "}\n"
        'System.out.printf("%.4f%n", 4.0 * inside / n);'
    )
    assert pi.status == "ok" and 3.0 < float(pi.stdout) < 3.3
    factorial = kernel.execute(
        "long factorial(int n) { return n <= 1 ? 1 : n * factorial(n - 1); }\nSystem.out.println(factorial(10));"
    )
    assert factorial.stdout == "3628800\n"
    fib = kernel.execute(
        "import java.util.*;\n"
        "List<Long> fib = new ArrayList<>(List.of(0L, 1L));\n"
        "while (fib.size() < 10) fib.add(fib.get(fib.size() - 1) + fib.get(fib.size() - 2));\n"
        'System.out.println(String.join(" ", fib.stream().map(String::valueOf).toList()));'
    )
    assert fib.stdout == "0 1 1 2 3 5 8 13 21 34\n"
    total = kernel.execute("System.out.println(java.util.stream.LongStream.rangeClosed(1, 10000).sum());")
    assert total.stdout == "50005000\n"


def test_state_is_kept_between_cells(kernel: Kernel) -> None:
    assert kernel.execute('String greeting = "hello";\nint counter = 41;').status == "ok"
    r = kernel.execute('counter += 1;\ngreeting + " " + counter')
    assert r.status == "ok" and r.data == [{"text/plain": "hello 42"}]
    assert r.proven  # the shim answered the gateway's nonce
    assert kernel.execute("record Point(int x, int y) {}").status == "ok"
    assert kernel.execute("new Point(3, 4)").data == [{"text/plain": "Point[x=3, y=4]"}]


def test_stdout_and_stderr_are_streamed(kernel: Kernel) -> None:
    r = kernel.execute('for (int i = 0; i < 100; i++) System.out.println(i);\nSystem.err.println("warning!");\n42')
    assert r.stdout == "".join(f"{i}\n" for i in range(100))
    assert r.stderr == "warning!\n"
    assert r.data == [{"text/plain": "42"}]


def test_an_error_has_its_name_message_and_traceback(kernel: Kernel) -> None:
    r = kernel.execute(
        'void check(int n) { if (n < 0) throw new IllegalArgumentException("negative: " + n); }\ncheck(-1);'
    )
    assert r.status == "error"
    (err,) = r.errors
    # JJava names whatever the cell threw RuntimeException (JShell's wrapper)
    # and puts the real class first in evalue; the traceback is the real one
    assert err["ename"] == "RuntimeException"
    assert err["evalue"] == "java.lang.IllegalArgumentException, negative: -1"
    assert "java.lang.IllegalArgumentException: negative: -1" in err["traceback"][0]
    assert any(".check(" in line for line in err["traceback"])
    assert r.reply["status"] == "error" and r.reply["evalue"] == err["evalue"]
    # a compile error is an error too, with javac's message
    r = kernel.execute("int y = undefinedVariable + 1;")
    assert r.status == "error"
    (err,) = r.errors
    assert any("cannot find symbol" in line for line in err["traceback"])
    assert kernel.execute("1 + 1").data == [{"text/plain": "2"}]  # and the kernel goes on


def test_html_display_and_a_chart(kernel: Kernel) -> None:
    r = kernel.execute('display("<table><tr><td>a</td><td>1</td></tr></table>", "text/html");')
    assert {"text/html": "<table><tr><td>a</td><td>1</td></tr></table>"} in [
        {k: v for k, v in d.items() if k == "text/html"} for d in r.data
    ]
    # a bar chart drawn with AWT (headless, fonts included) shows as a PNG
    r = kernel.execute(
        "import java.awt.*;\nimport java.awt.image.BufferedImage;\n"
        "var chart = new BufferedImage(240, 120, BufferedImage.TYPE_INT_RGB);\n"
        "var g = chart.createGraphics();\n"
        "g.setColor(Color.WHITE); g.fillRect(0, 0, 240, 120);\n"
        "int[] values = {30, 80, 55};\n"
        "for (int i = 0; i < values.length; i++) { g.setColor(Color.BLUE); g.fillRect(20 + i * 70, 110 - values[i], 50, values[i]); }\n"
        'g.setColor(Color.BLACK); g.drawString("sales", 100, 15); g.dispose();\n'
        "display(chart);"
    )
    assert r.status == "ok"
    png = base64.b64decode(r.data[0]["image/png"])
    assert png.startswith(b"\x89PNG") and len(png) > 200


def test_a_file_written_is_an_artifact(kernel: Kernel) -> None:
    r = kernel.execute(
        'import java.nio.file.*;\nFiles.writeString(Path.of("/workspace/result.csv"), "n,square\\n1,1\\n2,4\\n");'
    )
    assert r.status == "ok"
    assert r.artifacts == [{"path": "result.csv", "size": 17, "mime_type": "text/csv", "change": "created"}]
    assert kernel.execute("1").artifacts == []


def test_sandbox_no_network_a_read_only_root_and_the_jvm_limits(kernel: Kernel) -> None:
    r = kernel.execute(
        'try { new java.net.Socket("192.0.2.1", 80); System.out.println("CONNECTED"); }\n'
        'catch (java.io.IOException e) { System.out.println("FAILED"); }\n'
        'try { java.nio.file.Files.writeString(java.nio.file.Path.of("/opt/evil"), "x"); System.out.println("WROTE"); }\n'
        "catch (java.io.IOException e) { System.out.println(e.getClass().getSimpleName()); }\n"
        'System.out.println(System.getProperty("user.home") + " " + System.getProperty("user.dir"));\n'
        "System.out.println(Runtime.getRuntime().maxMemory() / (1 << 20));"
    )
    network, write, dirs, heap_mb = r.stdout.splitlines()
    assert network == "FAILED"
    assert write in ("AccessDeniedException", "FileSystemException")
    assert dirs == "/tmp/home /workspace"
    assert 280 <= int(heap_mb) <= 310  # 60% of the container's 512 MB
    r = kernel.execute("byte[] block = new byte[120 << 20];\nblock.length")
    assert r.status == "ok" and r.data == [{"text/plain": str(120 << 20)}]
    # 800 MB: the JVM says no, and the kernel lives
    r = kernel.execute("block = null;\nlong[] tooMuch = new long[100 << 20];")
    assert r.status == "error" and "OutOfMemoryError" in r.errors[0]["evalue"]
    assert kernel.execute("block == null").data == [{"text/plain": "true"}]
    # the class-data archive made at build time is in use
    r = kernel.execute(
        "java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments().stream()"
        '.filter(a -> a.startsWith("-XX:SharedArchiveFile")).count()'
    )
    assert r.data == [{"text/plain": "1"}]


def test_interrupt_ends_an_endless_loop_and_keeps_state(kernel: Kernel) -> None:
    kernel.execute("long spins = 0;")
    # one statement: JShell compiles each statement of a cell on its own, and an
    # interrupt that lands while the loop is compiled (after a print of its own) stops nothing
    r, seconds = kernel.interrupt_when_started(
        'while (true) { if (spins++ == 0) System.out.println("looping"); }', "looping"
    )
    assert r.status == "error"
    (err,) = r.errors
    assert "interrupted" in err["evalue"].lower()
    print(
        f"interrupted {seconds:.2f} s after the signal"  # not asserted: benchmarks/bench_languages.py measures it (interrupt)
    )
    assert kernel.execute("spins > 0").data == [{"text/plain": "true"}]
    assert kernel.state() == "running"


def test_cold_start_and_warm_round_trip() -> None:
    require_image(IMAGE, "java")
    with start_kernel(IMAGE) as started:
        k = started.kernel
        t0 = time.perf_counter()
        assert k.execute("1 + 1").data == [{"text/plain": "2"}]
        first = time.perf_counter() - t0
        for _ in range(3):
            k.execute("1 + 1")
        samples = []
        for _ in range(20):
            t0 = time.perf_counter()
            assert k.execute("1 + 1").data == [{"text/plain": "2"}]
            samples.append(time.perf_counter() - t0)
        print(
            f"\njava: cold start {started.ready_s:.2f} s, first cell {first * 1000:.0f} ms, "
            f"warm 1+1 p50 {p50(samples) * 1000:.1f} ms"
        )
        # cold start printed, not asserted: benchmarks/bench_languages.py measures it (create (cold))


def test_raw_writes_and_an_inherit_io_childs_output_are_the_cells_in_order(kernel: Kernel) -> None:
    """What the JVM writes to its own fd 1 and 2 (a FileOutputStream on
    FileDescriptor.out, an inheritIO() child) is the cell's stream output,
    before its end, in order with what it prints (the shim relays the kernel's
    fd 1 and 2: kernelgw_kernel.fdrelay)."""
    r = kernel.execute(
        'new java.io.FileOutputStream(java.io.FileDescriptor.out).write("raw-1\\n".getBytes());\n'
        'System.out.println("print-2");'
    )
    assert r.status == "ok" and r.stdout == "raw-1\nprint-2\n", r.messages
    child = kernel.execute(
        'new ProcessBuilder("sh", "-c", "echo child-out; echo child-err >&2").inheritIO().start().waitFor();\n'
        'new java.io.FileOutputStream(java.io.FileDescriptor.err).write("raw-err\\n".getBytes());'
    )
    assert child.status == "ok" and child.stdout == "child-out\n", child.messages
    assert child.stderr == "child-err\nraw-err\n", child.messages
