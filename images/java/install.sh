# Java kernel image (JJava on OpenJDK 17): run as root by
# `kernelgw image build --kernel java` in a network-less container of the
# Python kernel image; /build is the context (debs/, wheels/ and this directory).
set -eu

# What no kernel reads is never unpacked: documentation, manual pages, and
# the JDK's jmods (75 MB, only jlink uses them).
cat > /etc/dpkg/dpkg.cfg.d/kernelgw-slim <<'CFG'
path-exclude=/usr/share/doc/*
path-exclude=/usr/share/man/*
path-exclude=/usr/share/locale/*
path-exclude=/usr/lib/jvm/*/jmods/*
CFG

apt-get install -y --no-install-recommends /build/debs/*.deb
/opt/kernel/bin/python -m pip install --no-index --no-cache-dir --disable-pip-version-check \
    --find-links /build/wheels -r /build/requirements.txt
jar=/opt/kernel/share/jupyter/kernels/java/jjava.jar
test -f "$jar"

java_home=$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")
# the class-data archive for heaps over 32 GB (no compressed pointers): never
# used at kernel sizes
rm -rf "$java_home/jmods" "$java_home/lib/server/classes_nocoops.jsa"

install -d -m 0755 /opt/kernelgw/java
install -m 0644 /build/jvm.options /opt/kernelgw/java/jvm.options
install -m 0755 /build/start-kernel /opt/kernelgw/start-kernel

# Self-check and class-data archive: JJava runs typical cells as the kernel's
# user, offline; its classes are archived when the JVM exits (warmup.py).
work=$(mktemp -d)
cp /build/warmup.py "$work/"
chown -R 61000:61000 "$work"
(cd "$work" && setpriv --reuid=61000 --regid=61000 --clear-groups env HOME="$work" \
    /opt/kernel/bin/python "$work/warmup.py" "$work/jjava.jsa" -- \
    java @/opt/kernelgw/java/jvm.options -Duser.home="$work" -jar "$jar" '{connection_file}')
install -m 0644 "$work/jjava.jsa" /opt/kernelgw/java/jjava.jsa
rm -rf "$work"
# the archive is used: a JVM started with it maps its classes
java @/opt/kernelgw/java/jvm.options -XX:SharedArchiveFile=/opt/kernelgw/java/jjava.jsa -Xshare:on -cp "$jar" -version

rm -rf /var/cache/apt/archives/*.deb /var/cache/apt/*.bin /var/lib/apt/lists/* /var/log/apt \
    /var/log/dpkg.log /root/.cache /root/.java /tmp/* 2>/dev/null || true
