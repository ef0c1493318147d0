"""The compatibility DB's public model: frozen, pure, no I/O. ``load.py`` builds it from data files.

The models build their pydantic schema on first use (``defer_build``): a DB read from the cache of
checked DBs (``cache.py``) is made with ``model_construct`` and never validates, so a process such
as ``envspec explain`` does not pay for schemas it does not use."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict

from envspec.compat.arch import parse_cc

PYPI_INDEX = "https://pypi.org/simple"
PYTORCH_INDEX = "https://download.pytorch.org/whl"


class Variant(BaseModel):
    """One build of a torch release: ``cpu`` or ``cuXYZ``, and where its wheels are served."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str  # "cpu", "cu128"
    cuda: str | None  # CUDA runtime major.minor; None for cpu
    cudnn: str | None
    nccl: str | None
    arch_list: list[str]  # SASS sm_XY and PTX compute_XY entries; [] for cpu
    index: (
        str  # the index to take it from: PyPI for the build PyPI serves, else download.pytorch.org
    )
    local: str  # local version label of the wheels on `index` ("cu126"; "" for PyPI's build)
    source: str
    pypi: bool = False  # True for the build PyPI serves
    pytorch_index: str = ""  # the download.pytorch.org index that also serves this build
    pytorch_local: str = ""  # its local label there ("cu130" even for PyPI's build)

    def served_from(self, torch_index: str) -> Variant:
        """This build with ``torch_index`` (a spec's ``[sources].torch_index``: download.pytorch.org/whl
        or a mirror laid out like it) as the base of its PyTorch-index URLs: ``index`` when the build
        comes from there (``local`` is set) and ``pytorch_index``. PyPI's build keeps PyPI as ``index``.
        With the default base the result equals this variant."""
        base = torch_index.rstrip("/")
        update = {
            "pytorch_index": f"{base}/{self.pytorch_local}"
            if self.pytorch_local
            else self.pytorch_index
        }
        if self.local:
            update["index"] = f"{base}/{self.local}"
        return self.model_copy(update=update)


class TorchRelease(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    version: str  # public version, "2.9.1"
    python: list[str]  # "3.10", ... with Linux x86_64 CPython wheels on PyPI
    pypi_variant: str | None  # which variant PyPI's manylinux x86_64 wheel is
    variants: dict[str, Variant]  # by name, ascending CUDA (cpu first)
    source: str
    python_freethreaded: list[str] = []  # "3.13" for cp313t wheels
    needs_review: list[
        str
    ] = []  # what `db refresh` could not derive: its PyPI build is left out until curated

    def variant(self, name: str) -> Variant | None:
        return self.variants.get(name)


class CudaToolkit(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    version: str  # "12.8"
    driver_strict: str  # the toolkit's own minimum Linux driver
    driver_compat: str  # minimum driver under CUDA minor-version compatibility
    archs: list[str]  # sm_ targets nvcc accepts, including a/f variants
    source: str
    estimated: list[
        str
    ] = []  # the fields that are estimates, not read from a source ("driver_strict", "archs")


class Family(BaseModel):
    """What a compute capability fixes for every GPU that has it (gpus.toml's [[family]] rows)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    cc: str
    architecture: str  # the generation: "Kepler" ... "Blackwell"
    chips: str = ""
    min_driver: str = ""
    min_driver_source: str = ""
    max_driver: str = ""
    max_driver_source: str = ""
    driver_note: str = ""
    pypi_torch: bool = (
        True  # False: no torch from PyPI or download.pytorch.org runs on it (Jetson before Thor)
    )
    torch_note: str = ""  # an integrated GPU's: what PyPI's torch runs on it, what to use where none does; sources
    source: str = ""


class PcieLink(BaseModel):
    """A PCIe generation: GB/s per lane and direction after line encoding (gpus.toml's [[pcie]])."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    gen: int
    gt_s: float
    gbs_per_lane: float
    source: str = ""


class Gpu(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str  # as nvidia-smi prints it; "sm_90" for a synthetic GPU named by capability
    aliases: list[str] = []
    line: str = (
        ""  # product line: "datacenter", "workstation", "geforce", "jetson"; "" for a synthetic GPU
    )
    cc: str  # compute capability "9.0"
    architecture: str = (
        ""  # the generation its compute capability belongs to ("Hopper"), from its family
    )
    memory_gib: float | None = None
    bf16_tflops: float | None = None  # dense
    tf32_tflops: float | None = None  # dense
    mem_bw_gbs: float | None = None
    # NCCL all-reduce bus bandwidth a healthy node of 8 of these GPUs reaches (GB/s), and its source
    node_allreduce_busbw_gbs: float | None = None
    node_allreduce_source: str = ""
    source: str = ""
    min_driver: str = (
        ""  # the first driver branch that drives this GPU ("520"); "" where none applies
    )
    min_driver_source: str = ""
    max_driver: str = (
        ""  # the last driver branch that drives this GPU ("580"); "" where NVIDIA named none
    )
    max_driver_source: str = ""
    driver_note: str = ""  # where min_driver is "": why (Jetson Linux brings its own driver)
    pypi_torch: bool = (
        True  # its family's: False where no torch from PyPI or download.pytorch.org runs on it
    )
    torch_note: str = (
        ""  # its family's: what PyPI's torch runs on this integrated GPU, with sources
    )
    host_arch: list[str] = ["x86_64", "aarch64"]  # CPU architectures of the servers it ships in
    host_arch_source: str = ""

    @property
    def short(self) -> str:
        """The name users type: the first alias, else the nvidia-smi name."""
        return self.aliases[0] if self.aliases else self.name

    @property
    def grace_only(self) -> bool:
        """Ships only in Arm (aarch64) hosts: Grace systems, DGX Spark, Jetson."""
        return self.host_arch == ["aarch64"]

    def driver_too_old(self, driver: str) -> bool:
        """Whether ``driver`` ("470.82.01") is of an older branch than this GPU's first one."""
        return bool(self.min_driver) and driver_branch(driver) < driver_branch(self.min_driver)

    def driver_too_new(self, driver: str) -> bool:
        """Whether ``driver`` ("590.44.01") is of a newer branch than this GPU's last one."""
        return bool(self.max_driver) and driver_branch(driver) > driver_branch(self.max_driver)

    @property
    def sm(self) -> str:
        major, minor = parse_cc(self.cc)
        return f"sm_{major}{minor}"


def driver_branch(version: str) -> int:
    """The branch of a driver version: "570.86.16" -> 570, "615" -> 615."""
    return int(str(version).strip().split(".", 1)[0])


PLATFORMS = {"x86_64": "linux-x86_64", "aarch64": "linux-aarch64"}


def _norm(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


_PREFIXES = ("nvidiageforce", "nvidia", "tesla", "geforce")
# a GPU named by capability (compiled by re on first use: a name in the DB never needs it)
_SM_NAME = r"^(?:sm_?|compute_?)?(\d{1,2})(\d)$|^(\d{1,2})\.(\d)$"


def _model_tokens(name: str) -> list[str]:
    """The model numbers in a GPU name: "NVIDIA H100 80GB HBM3" -> ["h100"], "GeForce RTX 3060 Ti" ->
    ["3060"], "Tesla V100-SXM2-32GB" -> ["v100", "sxm2"]; sizes ("80gb") and memory kinds are not models."""
    out = []
    for chunk in re.findall(r"[a-z0-9]+", name.lower()):
        if re.fullmatch(r"\d+(g|gb|tb)|hbm\d+e?|gddr\d+x?|lpddr\d+x?", chunk):
            continue
        if re.fullmatch(r"[a-z]{1,4}\d{1,4}[a-z]{0,2}|\d{3,4}", chunk):
            out.append(chunk)
    return out


def _number(name: str) -> int | None:
    """The first model number of three or more digits in a name ("Quadro RTX 9000" -> 9000)."""
    m = re.search(r"(?<!\d)(\d{3,5})(?!\d)", name)
    return int(m.group(1)) if m else None


def _gap(number: int | None, gpu: Gpu) -> int:
    """How far a GPU's model number is from ``number``: the nearer first among equally close names."""
    theirs = _number(gpu.short) or _number(gpu.name)
    return abs(number - theirs) if number is not None and theirs is not None else 1 << 30


def _one_swap(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with two neighbouring characters swapped."""
    if len(a) != len(b) or a == b:
        return False
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    return (
        len(diff) == 2
        and diff[1] == diff[0] + 1
        and a[diff[0]] == b[diff[1]]
        and a[diff[1]] == b[diff[0]]
    )


def _series(token: str) -> tuple[str, str] | None:
    """A model number's series, whose models are of one generation or a few: NVIDIA's letter
    ("h300" is of h100's, H; "a800" of a100's, A; "gb10" of gb200's), else the leading digits of a
    GeForce number ("3065" of the 30s, "780" of the 700s). None for an interface ("sxm7")."""
    m = re.fullmatch(r"([a-z]*)(\d+)[a-z]*", token)
    if not m or m.group(1) == "sxm":
        return None
    letters, digits = m.group(1), m.group(2)
    if letters:
        return (letters, "")
    return ("", digits[:2] if len(digits) == 4 else digits[:1])


_LINE_WORDS = (
    ("jetson", ("jetson", "orin", "xavier", "thor", "tx2", "tx1")),
    ("workstation", ("quadro", "rtxa", "ada", "rtxpro", "workstation")),
    ("geforce", ("geforce", "gtx", "titan", "rtx")),
    ("datacenter", ("tesla", "hgx", "dgx", "sxm", "pcie", "nvl")),
)


def _line_of(name: str) -> str:
    """The product line a name's words suggest ("" when none does)."""
    key = _norm(name)
    for line, words in _LINE_WORDS:
        if any(w in key for w in words):
            return line
    return ""


@dataclass(frozen=True, eq=False)  # identity equality and hash: usable as a cache key
class CompatDB:
    """The loaded database. Build it with ``load_db()``; all queries are pure."""

    version: str
    date: str
    format: int
    torch_releases: list[TorchRelease]  # ascending by version
    cuda_toolkits: list[CudaToolkit]  # ascending by version
    gpus: list[Gpu]
    sources: dict[str, str] = field(default_factory=dict)  # data file -> what it holds
    families: list[Family] = field(default_factory=list)  # by compute capability, ascending
    pcie: list[PcieLink] = field(default_factory=list)  # by generation
    _releases: dict[str, TorchRelease] = field(default_factory=dict, repr=False, compare=False)
    _toolkits: dict[str, CudaToolkit] = field(default_factory=dict, repr=False, compare=False)
    _gpu_keys: dict[str, Gpu] = field(default_factory=dict, repr=False, compare=False)
    _gpu_labels: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    _gpu_tokens: dict[str, set[str]] = field(default_factory=dict, repr=False, compare=False)
    _token_gpus: dict[str, list[Gpu]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for r in self.torch_releases:
            self._releases[r.version] = r
        for t in self.cuda_toolkits:
            self._toolkits[t.version] = t
        for g in self.gpus:
            for label in [g.name, *g.aliases]:
                key = _norm(label)
                self._gpu_keys.setdefault(key, g)
                self._gpu_labels.setdefault(key, label)
                for p in _PREFIXES:
                    if key.startswith(p) and len(key) > len(p):
                        self._gpu_keys.setdefault(key[len(p) :], g)

    # -- torch ------------------------------------------------------------------------------------
    def torch_release(self, version: str) -> TorchRelease | None:
        """The release with this public version ("2.9.1"; a local label "+cu128" is ignored)."""
        try:
            v = Version(str(version))
        except InvalidVersion:
            return None
        return self._releases.get(v.public) or self._releases.get(str(Version(v.public)))

    # -- CUDA ------------------------------------------------------------------------------------
    def cuda_toolkit(self, version: str) -> CudaToolkit | None:
        """The toolkit for a CUDA major.minor ("12.8"; "12.8.1" finds 12.8)."""
        try:
            v = Version(str(version))
        except InvalidVersion:
            return None
        return self._toolkits.get(f"{v.major}.{v.minor}")

    # -- GPUs ------------------------------------------------------------------------------------
    def find_gpu(self, name: str) -> Gpu | None:
        """A GPU by nvidia-smi name or alias (case, spaces and punctuation ignored), or a synthetic
        GPU for a capability given as "sm_90", "sm90", "compute_90" or "9.0"."""
        text = str(name).strip()
        key = _norm(text)
        if key in self._gpu_keys:
            return self._gpu_keys[key]
        for p in _PREFIXES:
            if key.startswith(p) and key[len(p) :] in self._gpu_keys:
                return self._gpu_keys[key[len(p) :]]
        m = re.match(_SM_NAME, text.lower().replace(" ", ""))
        if m:
            major, minor = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            if 1 <= int(major) <= 15:
                return Gpu(
                    name=f"sm_{int(major)}{minor}",
                    cc=f"{int(major)}.{minor}",
                    source="synthetic: named by compute capability",
                )
        return None

    def suggest_gpus(self, name: str, n: int = 3) -> list[str]:
        """Did-you-mean: the closest known names and aliases, as written in the DB. Where the name
        carries a model number of a known generation ("H100-SXM5-80GB": h100, Hopper; "RTX 3065":
        the RTX 30s, Ampere), only GPUs of that generation are offered when one of them is close;
        among those, the product line the name suggests (GeForce, Quadro/RTX, Tesla, Jetson) first."""
        import difflib  # only for an unknown GPU's suggestions: kept off the path of a known one

        key = self._strip(_norm(str(name)))
        keys: dict[str, str] = {}
        for k, label in self._gpu_labels.items():
            keys.setdefault(k, label)
            keys.setdefault(self._strip(k), label)
        gens = self._generations_of(str(name))  # also makes self._token_gpus
        line = _line_of(str(name))
        scored: dict[int, tuple[float, Gpu]] = {}  # id(gpu) -> (best ratio of its names, gpu)
        matcher = difflib.SequenceMatcher()
        matcher.set_seq2(key)
        for k in keys:
            matcher.set_seq1(k)
            if matcher.quick_ratio() < 0.5:  # an upper bound of ratio(); a swap keeps it at 1
                continue
            r = (
                0.95 if _one_swap(key, k) else matcher.ratio()
            )  # "4900" for "4090": a slip of two keys
            if r < 0.5:
                continue
            g = self._gpu_keys[k]
            if r > scored.get(id(g), (0.0, g))[0]:
                scored[id(g)] = (r, g)
        # a model number the name carries ("T4 Turbo": t4) names its GPUs, however much else the name says
        for t in _model_tokens(str(name)):
            for g in [] if t.startswith("sxm") else self._token_gpus.get(t, []):
                scored[id(g)] = (max(0.75, scored.get(id(g), (0.0, g))[0]), g)
        ranked = list(scored.values())
        if gens and any(g.architecture in gens for _, g in ranked):
            ranked = [(r, g) for r, g in ranked if g.architecture in gens]
        number = _number(str(name))
        ranked.sort(key=lambda rg: (-(rg[1].line == line), -rg[0], _gap(number, rg[1]), rg[1].name))
        out: list[str] = []
        for _, g in ranked[:n]:
            # of the GPU's names, offer the one written most like the query
            out.append(
                max(
                    [g.name, *g.aliases],
                    key=lambda s: (
                        difflib.SequenceMatcher(None, key, self._strip(_norm(s))).ratio(),
                        -len(s),
                    ),
                )
            )
        return out

    def _generations_of(self, name: str) -> set[str]:
        """The architectures a name's model numbers belong to: "h100" in "H100-SXM5-80GB" is Hopper's;
        an unknown number takes the generation of the known ones of its series ("3065": the 30s)."""
        if not self._gpu_tokens:
            for g in self.gpus:
                for label in [g.name, *g.aliases]:
                    for t in _model_tokens(label):
                        self._gpu_tokens.setdefault(t, set()).add(g.architecture)
                        if g not in self._token_gpus.setdefault(t, []):
                            self._token_gpus[t].append(g)
        models: set[str] = set()
        forms: set[str] = set()  # from an interface ("sxm5"): only where no model number speaks
        for t in _model_tokens(name):
            found = self._gpu_tokens.get(t)
            if found is None and (series := _series(t)) is not None:
                found = set().union(
                    *(a for k, a in self._gpu_tokens.items() if _series(k) == series)
                )
            (forms if t.startswith("sxm") else models).update(found or ())
        return models or forms

    @staticmethod
    def _strip(key: str) -> str:
        for p in _PREFIXES:
            if key.startswith(p) and len(key) > len(p):
                return key[len(p) :]
        return key

    # -- output ----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, object]:
        """Everything, as plain JSON-able data (for `envspec db show --json`)."""
        return {
            "db_version": self.version,
            "date": self.date,
            "format": self.format,
            "torch_releases": [r.model_dump() for r in self.torch_releases],
            "cuda_toolkits": [t.model_dump() for t in self.cuda_toolkits],
            "families": [f.model_dump() for f in self.families],
            "pcie": [x.model_dump() for x in self.pcie],
            "gpus": [g.model_dump() for g in self.gpus],
            "sources": dict(self.sources),
        }
