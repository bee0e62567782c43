#!/bin/sh
# Builds the R kernel image on top of the Python kernel image: run as root,
# without network, with this directory (plus debs/) at /build.
set -eu

apt-get install -y --no-install-recommends /build/debs/*.deb

# Tcl/Tk: only R's tcltk package uses them (a GUI toolkit; no display here).
# r-base-core depends on the libraries, so they go without dpkg's consent.
rm -rf /usr/lib/R/library/tcltk
dpkg --purge --force-depends libtk8.6 libtcl8.6
rm -rf /usr/share/tcltk

# What an offline kernel never reads: manuals, HTML help and vignettes (the
# help pages themselves stay: ?mean works), message translations (LANG is
# C.UTF-8), C headers (there is no compiler), documentation and man pages.
rm -rf /usr/share/R/doc /usr/lib/R/doc /usr/share/R/include /usr/lib/R/include \
       /usr/lib/R/library/translations \
       /usr/lib/R/library/*/doc /usr/lib/R/library/*/html \
       /usr/lib/R/site-library/*/doc /usr/lib/R/site-library/*/html \
       /usr/share/doc/* /usr/share/man/* /usr/share/info/* /usr/share/locale/* /usr/share/lintian

install -m 0644 /build/Rprofile.site /etc/R/Rprofile.site
install -m 0755 /build/start-kernel /opt/kernelgw/start-kernel
install -m 0644 /build/kernel.R /opt/kernelgw/kernel.R

# no caches or logs of the install
rm -rf /var/cache/apt/* /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /var/log/alternatives.log /root/.cache

# Self-check: R starts, IRkernel and its ZMQ binding load, and a plot is drawn
# to PNG by cairo without X (as the kernel's user, in a fresh /tmp directory).
check=$(mktemp -d)
chown 61000:61000 "$check"
setpriv --reuid=61000 --regid=61000 --clear-groups env HOME="$check" TMPDIR="$check" \
    R --no-echo --no-restore --no-save -e '
        suppressMessages({ library(IRkernel); library(pbdZMQ); library(repr) })
        stopifnot(capabilities("cairo"), getOption("bitmapType") == "cairo")
        f <- tempfile(fileext = ".png"); png(f); plot(1:10); invisible(dev.off())
        stopifnot(file.size(f) > 1000)
        html <- repr_html(data.frame(x = 1:3))
        stopifnot(grepl("<table", html, fixed = TRUE))
        # kernel.R patches IRkernel before it starts
        exprs <- parse("/opt/kernelgw/kernel.R"); eval(exprs[[1]])
        methods <- IRkernel:::Kernel$def@refMethods
        stopifnot(identical(body(methods$abort_queued_messages), quote(invisible(NULL))))
        stopifnot(any(grepl("KeyboardInterrupt", deparse(body(methods$send_response)))))
        cat("R kernel image: ok\n")'
rm -rf "$check"
