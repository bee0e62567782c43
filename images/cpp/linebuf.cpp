// Linked into every program the C++ kernel builds: stdout line-buffered, as on
// a terminal, so a cell's output streams while it runs (a pipe would make it
// fully buffered: nothing until 4 KiB or the end). std::cout goes through
// stdio (sync_with_stdio is on by default), so it streams too. Runs before
// the program's own static constructors (priority 101).
#include <cstdio>

__attribute__((constructor(101))) static void kernelgw_line_buffered_stdout() {
    std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
}
