#!/bin/sh
# kernelgw C++ image: run as root by `kernelgw image build --kernel cpp` in a
# container of the Python kernel image, without network; /build is this
# directory plus debs/ (g++ and its dependencies).
set -eu

apt-get install -y --no-install-recommends /build/debs/*.deb

# The flags the kernel compiles with (precompiled headers are only used with the same ones).
FLAGS=$(/opt/kernel/bin/python -c 'from kernelgw_kernel.lang_cpp import CXXFLAGS; print(" ".join(CXXFLAGS))')
SUPPORT=/opt/kernelgw/cpp
mkdir -p "$SUPPORT/pch/bits"

# Precompiled headers, found before the real header when it is a program's
# first include (g++ looks for NAME.gch in each include directory first):
# <iostream> (0.7 s -> 0.2 s for a hello world) and <bits/stdc++.h> (4 s -> 0.5 s).
work=$(mktemp -d)
printf '#include <iostream>\n' > "$work/iostream.h"
printf '#include <bits/stdc++.h>\n' > "$work/stdc++.h"
g++ $FLAGS -x c++-header "$work/iostream.h" -o "$SUPPORT/pch/iostream.gch"
g++ $FLAGS -x c++-header "$work/stdc++.h" -o "$SUPPORT/pch/bits/stdc++.h.gch"
g++ $FLAGS -c -x c++ /build/linebuf.cpp -o "$SUPPORT/linebuf.o"

# What compiling C++ does not need: the C compiler proper, LTO, gold,
# profiling and sanitizer libraries, docs.
triplet=x86_64-linux-gnu
rm -f /usr/lib/gcc/$triplet/12/cc1 /usr/lib/gcc/$triplet/12/lto1 /usr/lib/gcc/$triplet/12/lto-wrapper \
      /usr/bin/$triplet-lto-dump-12 /usr/bin/lto-dump-12 /usr/bin/$triplet-ld.gold /usr/bin/ld.gold \
      /usr/bin/$triplet-dwp /usr/bin/dwp /usr/bin/$triplet-gprofng /usr/bin/gprofng* /usr/bin/$triplet-gp-*
rm -rf /usr/lib/$triplet/gprofng /usr/lib/$triplet/libgprofng.so* \
       /usr/lib/$triplet/libasan.so* /usr/lib/$triplet/libtsan.so* /usr/lib/$triplet/liblsan.so* \
       /usr/lib/$triplet/libubsan.so* /usr/lib/gcc/$triplet/12/libasan* /usr/lib/gcc/$triplet/12/libtsan* \
       /usr/lib/gcc/$triplet/12/liblsan* /usr/lib/gcc/$triplet/12/libubsan* /usr/lib/gcc/$triplet/12/libhwasan*
for deb in /build/debs/*.deb; do
    dpkg -L "$(dpkg-deb -f "$deb" Package)" 2>/dev/null | grep -E '^/usr/share/(doc|man|info|lintian|gdb)/' | while read -r f; do
        [ -d "$f" ] || rm -f "$f"
    done
done
rm -rf /var/cache/apt/* /var/lib/apt/lists/* /root/.cache
chmod -R a+rX "$SUPPORT"

# Self-check: a hello world compiles with the precompiled header and runs, the kernel imports.
printf '#include <iostream>\nint main() { std::cout << "c++ ok" << std::endl; }\n' > "$work/main.cpp"
(cd "$work" && g++ $FLAGS -Winvalid-pch -H -I "$SUPPORT/pch" -o prog main.cpp "$SUPPORT/linebuf.o" 2> headers.txt)
grep -q "^! $SUPPORT/pch/iostream.gch" "$work/headers.txt" || { echo "install.sh: the precompiled header was not used" >&2; cat "$work/headers.txt" >&2; exit 1; }
"$work/prog" | grep -qx 'c++ ok'
rm -rf "$work"
/opt/kernel/bin/python -c 'import kernelgw_kernel.lang_cpp'
install -m 0755 /build/start-kernel /opt/kernelgw/start-kernel
echo "install.sh: g++ $(g++ -dumpfullversion)"
