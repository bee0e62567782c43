#!/bin/sh
# Builds the Bash kernel image on top of the Python kernel image: run as root,
# without network, with this directory (plus wheels/) at /build.
set -eu

/opt/kernel/bin/python -m pip install --no-index --no-cache-dir --disable-pip-version-check \
    --find-links /build/wheels -r /build/requirements.txt
/opt/kernel/bin/python -m pip check
install -m 0755 /build/start-kernel /opt/kernelgw/start-kernel

# Record what is installed (as the Python image does), for GET /v1/images.
/opt/kernel/bin/python -c 'import importlib.metadata as m, json; print(json.dumps(dict(sorted((d.metadata["Name"], d.version) for d in m.distributions())), indent=1))' \
    > /opt/kernelgw/packages.json

rm -rf /root/.cache

# Self-check: bash_kernel and the launcher import, and bash starts behind
# pexpect as the kernel's user.
/opt/kernel/bin/python -c 'import bash_kernel.kernel, kernelgw_kernel.bash_launcher'
setpriv --reuid=61000 --regid=61000 --clear-groups env HOME=/tmp TMPDIR=/tmp \
    /opt/kernel/bin/python -m kernelgw_kernel.bash_launcher --check
