#!/bin/sh
# kernelgw Ruby image: run as root by `kernelgw image build --kernel ruby` in a
# container of the Python kernel image, without network; /build is this
# directory plus debs/ (ruby and its dependencies).
set -eu

apt-get install -y --no-install-recommends /build/debs/*.deb

mkdir -p /opt/kernelgw/ruby
install -m 0644 /build/kernelgw_driver.rb /opt/kernelgw/ruby/kernelgw_driver.rb

for deb in /build/debs/*.deb; do
    dpkg -L "$(dpkg-deb -f "$deb" Package)" 2>/dev/null | grep -E '^/usr/share/(doc|man|info|lintian|ri)/' | while read -r f; do
        [ -d "$f" ] || rm -f "$f"
    done
done
rm -rf /var/cache/apt/* /var/lib/apt/lists/* /root/.cache /root/.gem

# Self-check: the driver evaluates a cell (code on stdin, records on stdout), the kernel imports.
out=$(printf '{"code": "x = 20\\nx + 22", "cell": 1}\n' | ruby /opt/kernelgw/ruby/kernelgw_driver.rb 0 1)
echo "$out" | grep -q '"type":"ready"'
echo "$out" | grep -q '"result":{"text/plain":"42"}' || { echo "install.sh: the Ruby driver failed: $out" >&2; exit 1; }
/opt/kernel/bin/python -c 'import kernelgw_kernel.lang_ruby'
install -m 0755 /build/start-kernel /opt/kernelgw/start-kernel
echo "install.sh: $(ruby -v)"
