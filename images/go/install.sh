#!/bin/sh
# kernelgw Go image: run as root by `kernelgw image build --kernel go` in a
# container of the Python kernel image, without network; /build is this
# directory plus debs/ (golang-go and its dependencies).
set -eu

apt-get install -y --no-install-recommends /build/debs/*.deb

GOROOT=$(go env GOROOT)
SHARE=$(readlink -f "$GOROOT/src/..")

# Debian's standard library archives were built with cgo; cells build with
# CGO_ENABLED=0 (no C compiler in the image), which made every package that
# depends on net or os/user stale: importing net/http took 11 s per kernel.
# Rebuilt for cgo off, in place, nothing in the standard library is stale and a
# cell's build compiles only the cell (about 0.2 s).
export HOME=/tmp/install-home CGO_ENABLED=0 GOCACHE=/tmp/install-home/go-build GOPROXY=off GOFLAGS=-mod=mod
go install std
rm -rf /tmp/install-home

# What `go build` of a program does not need: the go tool's own sources and
# archives, tests, API lists, and tools for profiling, tracing and docs.
rm -rf "$GOROOT/pkg/linux_amd64/cmd" "$SHARE/src/cmd" "$SHARE/test" "$SHARE/api" "$SHARE/misc"
find "$SHARE/src" -name '*_test.go' -delete
find "$SHARE/src" -type d -name testdata -prune -exec rm -rf {} +
for tool in pprof trace api dist doc fix objdump addr2line nm test2json cover; do
    rm -f "$GOROOT/pkg/tool/linux_amd64/$tool"
done
# For the kernel: Go's compiler and linker run directly on these archives (an
# importcfg names each), which skips `go build`'s staleness checks (250 -> 80 ms).
mkdir -p /opt/kernelgw/go
archives="$GOROOT/pkg/linux_amd64"
(cd "$archives" && find . -name '*.a' | sed 's|^\./||; s|\.a$||' | sort) | while read -r pkg; do
    echo "packagefile $pkg=$archives/$pkg.a"
done > /opt/kernelgw/go/importcfg
tooldir=$(go env GOTOOLDIR)
printf '{"version": "%s", "goroot": "%s", "compile": "%s", "link": "%s", "importcfg": "%s"}\n' \
    "$(go env GOVERSION | sed 's/^go//')" "$GOROOT" "$tooldir/compile" "$tooldir/link" /opt/kernelgw/go/importcfg \
    > /opt/kernelgw/go/toolchain.json
chmod -R a+rX /opt/kernelgw/go

for deb in /build/debs/*.deb; do
    dpkg -L "$(dpkg-deb -f "$deb" Package)" 2>/dev/null | grep -E '^/usr/share/(doc|man|info|lintian)/' | while read -r f; do
        [ -d "$f" ] || rm -f "$f"
    done
done
rm -rf /var/cache/apt/* /var/lib/apt/lists/* /root/.cache

# Self-check: nothing stale, a program builds quickly and runs, the kernel imports.
check=$(mktemp -d)
export HOME="$check" GOCACHE="$check/cache"
stale=$(go list -f '{{if .Stale}}{{.ImportPath}}{{end}}' std)
if [ -n "$stale" ]; then
    echo "install.sh: standard library packages still stale: $stale" >&2
    exit 1
fi
printf 'package main\n\nimport (\n\t"fmt"\n\t"net/http"\n)\n\nvar _ = http.StatusOK\n\nfunc main() { fmt.Println("go ok") }\n' > "$check/main.go"
(cd "$check" && go build -o prog main.go && ./prog) | grep -qx 'go ok'
(cd "$check" && "$tooldir/compile" -o main.a -p main -complete -pack -importcfg /opt/kernelgw/go/importcfg main.go \
    && "$tooldir/link" -s -w -importcfg /opt/kernelgw/go/importcfg -o prog2 main.a && ./prog2) | grep -qx 'go ok'
rm -rf "$check"
/opt/kernel/bin/python -c 'import kernelgw_kernel.lang_go as g; assert g.load_toolchain(), "toolchain.json"'
install -m 0755 /build/start-kernel /opt/kernelgw/start-kernel
echo "install.sh: $(go version)"
