# Deno kernel image: run as root by `kernelgw image build --kernel deno` in a
# network-less container of the Python kernel image; /build is the context.
set -eu

/opt/kernel/bin/python -m pip install --no-index --no-cache-dir --disable-pip-version-check \
    --find-links /build/wheels -r /build/requirements.txt
install -m 0755 /build/start-kernel /opt/kernelgw/start-kernel

# self-check: the binary runs, offline, as the kernel's user, and TypeScript works
check=$(mktemp -d)
chmod 0777 "$check"
out=$(cd "$check" && setpriv --reuid=61000 --regid=61000 --clear-groups env HOME="$check" DENO_DIR="$check/deno" \
    DENO_NO_UPDATE_CHECK=1 DENO_NO_PROMPT=1 NO_COLOR=1 \
    /opt/kernel/bin/deno eval --ext=ts 'const n: number = 6 * 7; console.log(`${Deno.version.deno} ${n}`)')
rm -rf "$check"
echo "deno self-check: $out"
[ "$out" = "2.9.8 42" ]
/opt/kernel/bin/python -m pip show -q deno >/dev/null

rm -rf /root/.cache /tmp/* 2>/dev/null || true
