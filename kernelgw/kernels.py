"""The kernels a gateway can offer: one profile per language.

A profile names a kernel the way Jupyter clients and docs know it (its
kernelspec name), says what it runs (language, whether variables live from one
cell to the next) and where its image comes from (``images/<name>`` of the
source tree, built on the Python kernel image). The gateway offers the names in
its ``kernels`` setting; ``python3`` is the default and the only one that runs
IPython (and so the only one that installs packages).

Shared by the image builder, the runtime and the HTTP layer, so it imports
none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_KERNEL = "python3"


@dataclass(frozen=True)
class KernelProfile:
    name: str
    """The kernelspec name clients ask for (``kernel`` in /v1, ``name`` in /api)."""
    display_name: str
    language: str
    """As Jupyter spells it in ``language_info.name`` (``typescript`` for Deno)."""
    file_extension: str
    mimetype: str
    pygments_lexer: str
    keeps_state: bool
    """Whether variables live on between cells (False: each cell is a whole
    program, compiled and run on its own)."""
    version: str = ""
    """The language's version in the image (as the image's packages pin it)."""
    codemirror_mode: str = ""

    @property
    def python(self) -> bool:
        """IPython inside: artifacts by its extension, packages with pip,
        pause and resume by pickling its namespace."""
        return self.name == DEFAULT_KERNEL

    @property
    def image(self) -> str:
        """The image tag a gateway runs it from unless told otherwise."""
        return f"kernelgw/{self.name}:latest"

    def language_info(self) -> dict[str, str]:
        """``language_info`` for a notebook's metadata (nbformat's fields)."""
        info = {
            "name": self.language,
            "file_extension": self.file_extension,
            "mimetype": self.mimetype,
            "pygments_lexer": self.pygments_lexer,
        }
        if self.codemirror_mode:
            info["codemirror_mode"] = self.codemirror_mode
        if self.version:
            info["version"] = self.version
        return info

    def kernelspec(self) -> dict[str, str]:
        """``kernelspec`` for a notebook's metadata."""
        return {"name": self.name, "display_name": self.display_name, "language": self.language}


PROFILES: dict[str, KernelProfile] = {
    p.name: p
    for p in (
        KernelProfile(
            "python3", "Python 3 (ipykernel)", "python", ".py", "text/x-python", "ipython3", True, "3.11", "ipython"
        ),
        KernelProfile(
            "deno",
            "Deno (JavaScript, TypeScript)",
            "typescript",
            ".ts",
            "text/x.typescript",
            "typescript",
            True,
            "5.9",
            "typescript",
        ),
        KernelProfile("ir", "R", "R", ".r", "text/x-r-source", "r", True, "4.2", "r"),
        KernelProfile("bash", "Bash", "bash", ".sh", "text/x-sh", "bash", True, "5.2", "shell"),
        KernelProfile("java", "Java (JJava)", "java", ".jshell", "text/x-java-source", "java", True, "17", "java"),
        KernelProfile("go", "Go (compiled per cell)", "go", ".go", "text/x-go", "go", False, "1.19", "go"),
        KernelProfile(
            "cpp", "C++ (compiled per cell)", "c++", ".cpp", "text/x-c++src", "cpp", False, "17", "text/x-c++src"
        ),
        KernelProfile("ruby", "Ruby", "ruby", ".rb", "text/x-ruby", "ruby", True, "3.1", "ruby"),
    )
}
"""Every kernel kernelgw knows how to build and run, by name."""


class UnknownKernel(ValueError):
    """A kernel name that is not one of :data:`PROFILES`."""


def profile(name: str) -> KernelProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownKernel(f"unknown kernel {name!r}; kernelgw knows {sorted(PROFILES)}") from None


CODE_INTERPRETER_BUNDLE = "code-interpreter"
"""The image that holds every kernel E2B's code interpreter runs, Python first."""
BUNDLES: dict[str, tuple[str, ...]] = {CODE_INTERPRETER_BUNDLE: ("python3", "deno", "bash", "java", "ir")}
"""Images of several kernels (``kernelgw/<name>:latest``), by name: the first is
the one a container of it starts; each other one starts as a context (a child
kernel) from ``BUNDLE_START_DIR/<kernel>/start-kernel``. They are installed in
this order: R's install leaves apt unwilling to install more (it drops Tk,
which r-base-core names), so it comes last."""
BUNDLE_START_DIR = "/opt/kernelgw/kernels"


def bundle_image(name: str) -> str:
    return f"kernelgw/{name}:latest"


def bundle_of(image: str | None) -> str | None:
    """The bundle an image is (by its name), if any."""
    for name in BUNDLES:
        if image == bundle_image(name):
            return name
    return None


def image_kernels(image_kernel: str, image: str | None = None) -> tuple[str, ...]:
    """The kernels an image made for ``image_kernel`` holds: a bundle's (``image``
    names one) or its own, and Python (every language image is built on the
    Python image, so its interpreter and ipykernel are there too). A sandbox's
    contexts can run these, and no other."""
    bundle = bundle_of(image)
    if bundle is not None:
        return BUNDLES[bundle]
    return (image_kernel,) if image_kernel == DEFAULT_KERNEL else (image_kernel, DEFAULT_KERNEL)
