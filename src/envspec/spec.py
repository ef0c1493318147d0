"""The spec stage: TOML bytes -> ``EnvSpec``.

Every problem is reported at once, each with its TOML path and line (pydantic gives the path,
``_LineIndex`` finds the line), and unknown keys get a did-you-mean.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)

from envspec.errors import Problem, SpecError

TomlPath = tuple[
    str | int, ...
]  # a key's path in a TOML document: ("torch", "version"), ("apt", 0)

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_SIZE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?\s*([kmgt]i?b?|b)?$", re.IGNORECASE)
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PY_RE = re.compile(r"^3\.[0-9]{1,2}$")
PLATFORM_NAMES = ("linux-x86_64", "linux-aarch64")  # what [target].platforms accepts


class _Model(BaseModel):
    # Lists and tables default to plain values, not ``default_factory=list``: pydantic copies a
    # mutable default for each model, and each factory costs a signature inspection (of ``list``,
    # through the tokenizer) when the class is made, on every `envspec explain`.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, str_strip_whitespace=True)


# The requirement nearly every spec writes: a PEP 508 name and version clauses, without spaces,
# extras, markers or a URL ("numpy>=2", "einops>=0.8,<1", "torchvision==0.29.*"). packaging's
# parser accepts every such string and reads this name from it (tests/unit/test_spec.py checks
# both on generated strings); any other string is parsed by packaging.requirements, imported then:
# with the marker grammar and packaging.tags it was 7% of `envspec explain` (callgrind, 2026-12-03,
# commit 8a8292e), for specs that list only such requirements.
_VERSION = r"[0-9]+(?:\.[0-9]+)*"
_CLAUSE = rf"(?:(?:==|!=){_VERSION}(?:\.\*)?|~={_VERSION}\.[0-9]+|(?:<=|>=|<|>){_VERSION})"
_SIMPLE_REQUIREMENT = re.compile(
    rf"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?:{_CLAUSE}(?:,{_CLAUSE})*)?"
)


def requirement_name(text: str) -> str:
    """The normalized project name of a PEP 508 requirement: "Foo_Bar>=1" -> "foo-bar". Raises
    packaging's ``InvalidRequirement`` (a ``ValueError``) for a string that is not one."""
    m = _SIMPLE_REQUIREMENT.fullmatch(text)
    if m:
        name = m["name"]
    else:
        from packaging.requirements import Requirement

        name = Requirement(text).name
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503, as packaging.utils.canonicalize_name


def _check_requirement(v: str) -> str:
    """One item of a list of requirements: each item is checked on its own, so that every bad item
    is reported, not only the first."""
    if not _SIMPLE_REQUIREMENT.fullmatch(v):
        from packaging.requirements import InvalidRequirement, Requirement

        try:
            Requirement(v)
        except InvalidRequirement as e:
            reason = str(e).splitlines()[0]
            raise ValueError(f"{v!r} is not a PEP 508 requirement ({reason})") from None
    return v


def _check_deb(v: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", v):
        raise ValueError(f"{v!r} is not a Debian package name")
    return v


Req = Annotated[str, AfterValidator(_check_requirement)]  # a PEP 508 requirement
DebName = Annotated[str, AfterValidator(_check_deb)]  # a Debian package name


class Target(_Model):
    """The hardware the image runs on: the GPUs, the hosts' oldest driver, the CPU platforms."""

    gpus: list[str] = Field(
        default=[],
        examples=[["H100"], ["A100 80GB", "L40S"]],
        description="the GPUs the image must run on, by the names `envspec db show` lists (or "
        "sm_XY); empty: a CPU image",
    )
    driver: str | None = Field(
        default=None,
        examples=["580.65.06"],
        description="the oldest NVIDIA driver on the hosts (`nvidia-smi "
        "--query-gpu=driver_version --format=csv,noheader`); left out, the newest "
        "build's floor is assumed and said (docs/lockfile.md)",
    )
    driver_policy: Literal["compat", "strict"] = Field(
        default="compat",
        examples=["strict"],
        description='"compat": a driver runs a newer CUDA of its major version (CUDA\'s minor-version '
        'compatibility); "strict": only the toolkit\'s own driver floor',
    )
    platforms: list[str] = Field(
        default=[],
        examples=[["linux-x86_64", "linux-aarch64"]],
        description='the hosts\' CPU platforms, "linux-x86_64" and/or "linux-aarch64"; '
        "both give one lock with a section each; default from the GPUs "
        "(x86_64 without GPUs)",
    )

    @field_validator("driver")
    @classmethod
    def _driver(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not re.fullmatch(r"[0-9]{3}(\.[0-9]{1,3}){0,2}", v):
            raise ValueError(f"{v!r} is not an NVIDIA driver version like '535.230.02'")
        return v


class Python(_Model):
    """The image's Python and the packages a team adds, resolved together with torch."""

    version: str = Field(
        default="3.11",
        examples=["3.13"],
        description="the image's Python: 3.11 (Debian bookworm) or 3.13 (trixie); with "
        '[system].base = "none", any',
    )
    packages: list[Req] = Field(
        default=[],
        examples=[["transformers>=4.50", "datasets", "vllm"]],
        description="PEP 508 requirements, resolved with torch: torch moves to the newest "
        "release they all accept",
    )
    constraints: list[Req] = Field(
        default=[],
        examples=[["numpy<2.3"]],
        description="pins applied to whatever needs the package, without asking for it",
    )
    # a policy of `envspec lock`, not an input of the resolution: not in the spec hash
    held_back: Literal["warn", "error"] = Field(
        default="warn",
        examples=["error"],
        description="a named package held below its newest release (a torch pin, no wheel, the Python version) "
        'or at a pre-release nobody asked for: "warn" writes the lock and says why, "error" '
        "refuses it (for CI)",
    )
    from_source: Literal["auto", "never"] = Field(
        default="auto",
        examples=["never"],
        description='a package with no wheel for the platform: "auto" locks its sdist and builds the wheel '
        'from it with pinned inputs (docs/build.md); "never": wheels only (no-wheel)',
    )

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if not _PY_RE.match(v):
            raise ValueError(f"{v!r} is not a Python version like '3.11'")
        return v


class Torch(_Model):
    """torch: the range of releases, the CUDA build, and its family from the same index. Left out,
    the image has no torch."""

    version: str = Field(
        default="*",
        examples=["2.14", "==2.14.1", ">=2.12,<2.15"],
        description="a PEP 440 range; a bare version of one or two parts is every release it "
        'starts ("2.14" is ==2.14.*); "*": the newest that fits',
    )
    cuda: str = Field(
        default="auto",
        examples=["cpu", "12.8"],
        description='"auto": the build that fits the GPUs and driver (PyPI\'s where it fits); '
        '"cpu": the CPU build; "12.8": that CUDA\'s build',
    )
    packages: list[Req] = Field(
        default=[],
        examples=[["torchvision", "torchaudio"]],
        description="torch-family packages from the same index as torch, e.g. torchvision",
    )

    @field_validator("version")
    @classmethod
    def _spec(cls, v: str) -> str:
        text = v.strip()
        if text in ("", "*"):
            return "*"
        if re.fullmatch(
            r"\d+(\.\d+)?", text
        ):  # "2.9" means any 2.9 release (2.9.*), as most users mean it,
            text = f"=={text}.*"  # not PEP 440's 2.9.0 (docs/spec.md)
        elif text[0].isdigit():
            text = "==" + text
        try:
            SpecifierSet(text)
        except InvalidSpecifier:
            raise ValueError(
                f"{v!r} is not a PEP 440 version specifier like '2.14.*' or '>=2.7,<2.10'"
            ) from None
        return text

    @field_validator("cuda")
    @classmethod
    def _cuda(cls, v: str) -> str:
        if v in ("auto", "cpu") or re.fullmatch(r"1[0-9]\.[0-9]", v):
            return v
        raise ValueError(f"{v!r} is not 'auto', 'cpu' or a CUDA version like '12.8'")

    def specifier(self) -> SpecifierSet:
        return SpecifierSet("" if self.version == "*" else self.version)


class System(_Model):
    """The Debian base under the image and the Debian packages a team adds."""

    packages: list[DebName] = Field(
        default=[],
        examples=[["libgl1", "ffmpeg"]],
        description="Debian packages, pinned with their dependencies by sha256",
    )
    base: str = Field(
        default="auto",
        examples=["debian:trixie", "none"],
        description='"auto" (the Debian release of [python].version), "debian:bookworm", '
        '"debian:trixie", or "none": a lock for a host\'s own Python, verified '
        "but not built",
    )
    compiler: bool | None = Field(
        default=None,
        examples=[False],
        description="a C compiler and Python headers (torch.compile's Triton and "
        "Inductor need them); default: on where the spec has torch",
    )

    @field_validator("base")
    @classmethod
    def _base(cls, v: str) -> str:
        if v in ("auto", "none", "debian:bookworm", "debian:trixie"):
            return v
        raise ValueError(f"{v!r} is not one of 'auto', 'debian:bookworm', 'debian:trixie', 'none'")


class Jupyter(_Model):
    """JupyterLab in the image, started by `envspec run` with a token of its own."""

    enabled: bool = Field(
        default=True,
        examples=[False],
        description="start JupyterLab when the image runs without a command",
    )
    port: int = Field(
        default=8888, ge=1, le=65535, examples=[8890], description="its port in the container"
    )
    extensions: list[Req] = Field(
        default=[],
        examples=[["jupyterlab-git"]],
        description="extra Python packages for JupyterLab",
    )


class Ssh(_Model):
    """An SSH server in the image: keys only, no password, no root, a host key made at start."""

    enabled: bool = Field(
        default=True,
        examples=[False],
        description="start sshd when the image runs without a command",
    )
    port: int = Field(
        default=2222, ge=1, le=65535, examples=[2200], description="its port in the container"
    )
    authorized_keys: str = Field(
        default="",
        examples=["authorized_keys"],
        description="a file of public keys, relative to the spec, baked into the image "
        "(its hash is in the lock); empty: keys given at run time in "
        "ENVSPEC_AUTHORIZED_KEYS",
    )


class Services(_Model):
    """What the image serves when it runs without a command."""

    jupyter: Jupyter | None = Field(default=None, description="[services.jupyter]: JupyterLab")
    ssh: Ssh | None = Field(default=None, description="[services.ssh]: an SSH server")


class Runtime(_Model):
    """How the image runs: torch's math settings, the container's limits, its user."""

    tf32: bool = Field(
        default=True,
        examples=[False],
        description="TF32 matmuls and convolutions on Ampere and "
        "newer (torch.backends.*.allow_tf32)",
    )
    matmul_precision: Literal["highest", "high", "medium"] | None = Field(
        default=None,
        examples=["medium"],
        description='torch.set_float32_matmul_precision; default "high" with tf32, else "highest"',
    )
    shm_size: str = Field(
        default="16g",
        examples=["64g"],
        description="the container's /dev/shm (DataLoader workers, NCCL)",
    )
    env: dict[str, str] = Field(
        default={},
        examples=[{"NCCL_DEBUG": "WARN"}],
        description="environment variables of the image",
    )
    ulimits: dict[str, int] = Field(
        default={"memlock": -1, "stack": 67108864},
        examples=[{"nofile": 1048576}],
        description="the container's limits (-1: unlimited); `envspec run` keeps them "
        "within the host's",
    )
    user: str = Field(default="envspec", examples=["ml"], description="the image's user (not root)")
    uid: int = Field(default=1000, ge=1, le=65533, examples=[1001], description="that user's uid")

    @field_validator("shm_size")
    @classmethod
    def _size(cls, v: str) -> str:
        if not _SIZE_RE.match(v):
            raise ValueError(f"{v!r} is not a size like '16g' or '512m'")
        return v.lower().replace(" ", "")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not _ENV_RE.match(k):
                raise ValueError(f"{k!r} is not an environment variable name")
        return dict(sorted(v.items()))

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", v) or v == "root":
            raise ValueError(f"{v!r} is not a non-root user name")
        return v

    def precision(self) -> str:
        return self.matmul_precision or ("high" if self.tf32 else "highest")


class Build(_Model):
    """How `envspec build` spends the machine on wheels built from sdists; not an input of the lock
    (not in the spec hash)."""

    parallel: int = Field(
        default=1, ge=1, le=64, examples=[2], description="wheels built from sdists at once"
    )
    jobs: int = Field(
        default=0,
        ge=0,
        le=1024,
        examples=[16],
        description="compile jobs of each (MAKEFLAGS -j, MAX_JOBS, CMAKE_BUILD_PARALLEL_LEVEL); 0: "
        "the cores divided among the builds",
    )


class Sources(_Model):
    """Where packages and layers come from. The indexes are part of the lock's identity; mirrors
    (which serve the same files) are not."""

    index: str = Field(
        default="https://pypi.org/simple",
        examples=["https://pypi.example/simple"],
        description="the Python package index",
    )
    extra_indexes: list[str] = Field(
        default=[],
        examples=[["https://pkgs.example/simple"]],
        description="more indexes, after index",
    )
    torch_index: str = Field(
        default="https://download.pytorch.org/whl",
        examples=["https://mirror.example/whl"],
        description="the PyTorch index (its cuXYZ/ and cpu/ builds)",
    )
    mirrors: list[str] = Field(
        default=[],
        examples=[["file:///srv/wheels", "https://proxy.example/simple"]],
        description="indexes or folders serving the same files, tried first; not in the lock",
    )
    use_pip_config: bool = Field(
        default=True,
        examples=[False],
        description="also take pip's configured index-url, extra-index-url and "
        "find-links as mirrors",
    )
    debian_mirror: str = Field(
        default="http://deb.debian.org/debian",
        examples=["http://mirror.example/debian"],
        description="the Debian mirror",
    )
    debian_security_mirror: str = Field(
        default="http://deb.debian.org/debian-security",
        examples=["http://mirror.example/debian-security"],
        description="the Debian security mirror",
    )
    debian_snapshot: str = Field(
        default="",
        examples=["https://snapshot.debian.org/archive/debian/20261201T000000Z"],
        description="a snapshot mirror tried first for pinned .debs that Debian's mirror "
        "no longer serves",
    )
    cache_from: str = Field(
        "",
        examples=["registry.example/ml/cache"],
        description="a registry repository to take layers from (build --cache-from)",
    )
    cache_to: str = Field(
        "",
        examples=["registry.example/ml/cache"],
        description="a registry repository to push made layers to (build --cache-to)",
    )


class EnvSpec(_Model):
    """An envspec spec: one TOML file."""

    name: str = Field(
        examples=["h100-train"],
        description="names the lock (lockfiles/<name>.lock) and the image "
        "(localhost/envspec/<name>:<lock hash>)",
    )
    description: str = Field(
        default="", examples=["PyTorch training on H100 nodes"], description="for people"
    )
    target: Target = Field(default_factory=Target, description="[target]")
    python: Python = Field(default_factory=Python, description="[python]")
    torch: Torch | None = Field(default=None, description="[torch]")
    system: System = Field(default_factory=System, description="[system]")
    services: Services = Field(default_factory=Services, description="[services]")
    runtime: Runtime = Field(default_factory=Runtime, description="[runtime]")
    build: Build = Field(default_factory=Build, description="[build]")
    sources: Sources = Field(default_factory=Sources, description="[sources]")

    _file: str = PrivateAttr(default="")
    _lines: dict[TomlPath, int] = PrivateAttr(default={})

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"{v!r} is not a name of lowercase letters, digits, '.', '_' or '-' (it names the image)"
            )
        return v

    # -- where things are, for later stages' errors -------------------------------------
    @property
    def file(self) -> str:
        return self._file

    def line_of(self, *path: str | int) -> int | None:
        return _nearest_line(self._lines, tuple(path))

    def problem(self, path: TomlPath, message: str, hint: str = "", reference: str = "") -> Problem:
        return Problem(
            message, path=toml_path(path), line=self.line_of(*path), hint=hint, reference=reference
        )

    @property
    def wants_gpu(self) -> bool:
        return self.torch is not None and self.torch.cuda != "cpu"

    def spec_hash(self) -> str:
        """sha256 of the resolution-relevant fields (docs/lockfile.md lists them)."""
        import hashlib  # only the lock stage hashes a spec: OpenSSL's libcrypto stays off explain's path

        data = self.model_dump(mode="json", exclude={"description"})
        del data["python"][
            "held_back"
        ]  # a policy of `envspec lock`, not an input of the resolution
        if (
            data["python"]["from_source"] == "auto"
        ):  # the default: the hash of a spec written before the key existed
            del data["python"]["from_source"]
        del data["build"]  # how `envspec build` spends the machine, not what it makes
        src = data.pop("sources")
        data["sources"] = {
            k: src[k] for k in ("index", "extra_indexes", "torch_index", "debian_mirror")
        }
        if not data["target"][
            "platforms"
        ]:  # unset: the hash of a spec written before the key existed
            del data["target"]["platforms"]
        blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()


# ---------------------------------------------------------------------------------------
# TOML paths and lines


def toml_path(loc: TomlPath) -> str:
    """("target", "gpus", 0) -> "[target].gpus[0]"; ("name",) -> "name"."""
    parts = [p for p in loc if p not in ("function-after", "function-before")]
    if not parts:
        return "(top level)"
    out = ""
    tables: list[str] = []
    i = 0
    while (
        i < len(parts) and isinstance(parts[i], str) and i < len(parts) - 1 and parts[i] in _TABLES
    ):
        tables.append(str(parts[i]))
        i += 1
        if tables == ["services"] and i < len(parts) - 1 and isinstance(parts[i], str):
            tables.append(str(parts[i]))
            i += 1
        break
    if tables:
        out = "[" + ".".join(tables) + "]"
    rest = parts[i:]
    for p in rest:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


_TABLES = {"target", "python", "torch", "system", "services", "runtime", "build", "sources"}


class _LineIndex:
    """Maps TOML key paths to the line where they are written (tomllib gives no positions)."""

    _header = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$")
    _key = re.compile(r"^\s*([A-Za-z0-9_\"'.-]+)\s*=")

    @classmethod
    def build(cls, text: str) -> dict[TomlPath, int]:
        lines: dict[TomlPath, int] = {}
        table: TomlPath = ()
        depth = 0  # inside a multi-line array
        array_key: TomlPath | None = None
        array_idx = 0
        for n, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0] if '"' not in raw and "'" not in raw else raw
            if depth > 0 and array_key is not None:
                stripped = line.strip()
                if stripped and not stripped.startswith("]") and not stripped.startswith("#"):
                    lines.setdefault(array_key + (array_idx,), n)
                    array_idx += stripped.count(",") if stripped.endswith(",") else 1
                depth += line.count("[") - line.count("]")
                if depth <= 0:
                    array_key = None
                continue
            m = cls._header.match(line)
            if m:
                table = tuple(p.strip().strip("\"'") for p in m.group(1).split("."))
                lines.setdefault(table, n)
                continue
            m = cls._key.match(line)
            if m:
                key = tuple(p.strip().strip("\"'") for p in m.group(1).split("."))
                full = table + key
                lines.setdefault(full, n)
                value = line.split("=", 1)[1]
                opened = value.count("[") - value.count("]")
                if value.strip().startswith("[") and opened > 0:
                    depth, array_key, array_idx = opened, full, 0
                elif value.strip().startswith("["):
                    for i in range(max(value.count(","), 0) + 1):
                        lines.setdefault(full + (i,), n)
        return lines


def _nearest_line(lines: dict[TomlPath, int], path: TomlPath) -> int | None:
    p = tuple(path)
    while p:
        if p in lines:
            return lines[p]
        p = p[:-1]
    return None


# ---------------------------------------------------------------------------------------

_TOML_ERR = r"\(at line (\d+), column (\d+)\)"  # compiled by re for a spec that is not TOML


def _read_toml(text: str, file: str) -> dict[str, Any]:
    """The spec's TOML tables; text that is not TOML, or a lockfile: ``SpecError``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(_TOML_ERR, str(e))
        line = int(m.group(1)) if m else None
        msg = re.sub(_TOML_ERR, "", str(e)).strip()
        raise SpecError(
            file,
            [
                Problem(
                    f"not valid TOML: {msg}",
                    path="",
                    line=line,
                    hint="check quotes, brackets and '=' on that line",
                    reference="toml-syntax",
                )
            ],
        ) from None
    meta = data.get("meta")
    if (
        isinstance(meta, dict)
        and "version" in data
        and ("content_hash" in meta or "wheels" in data)
    ):
        made_from = f" (written from {meta['spec']})" if isinstance(meta.get("spec"), str) else ""
        raise SpecError(
            file,
            [
                Problem(
                    f"this is a lockfile{made_from}, not a spec",
                    path="",
                    line=1,
                    hint="give the spec it was locked from (`envspec explain` and `envspec lock` "
                    "take a spec; `build`, `diff`, `doctor` and `verify` a lock)",
                    reference="lock-not-spec",
                )
            ],
        )
    return data


def parse_spec(text: str, file: str | Path = "<spec>") -> EnvSpec:
    """Parse and validate spec text. Raises SpecError listing every problem."""
    file = str(file)
    text = text.removeprefix(
        "\ufeff"
    )  # a UTF-8 byte order mark some editors save: not TOML, and no meaning here
    data = _read_toml(text, file)
    lines = _LineIndex.build(text)
    problems: list[Problem] = []
    spec: EnvSpec | None = None
    try:
        spec = EnvSpec.model_validate(data)
    except ValidationError as e:
        for err in e.errors():
            problems.append(_problem_from_pydantic(err, lines, text))
    if spec is not None:
        spec._file = file
        spec._lines = lines
        problems.extend(_cross_checks(spec, Path(file)))
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.path))
        raise SpecError(file, problems)
    assert spec is not None
    return spec


def load_spec(path: str | Path) -> EnvSpec:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(
            str(p),
            [
                Problem(
                    "no such file",
                    hint="give the path of a spec, e.g. specs/h100.toml",
                    reference="spec-not-found",
                )
            ],
        ) from None
    except (UnicodeDecodeError, IsADirectoryError) as e:
        raise SpecError(
            str(p), [Problem(f"cannot read as UTF-8 text: {e}", reference="spec-unreadable")]
        ) from None
    return parse_spec(text, p)


def _model_at(loc: TomlPath) -> type[BaseModel] | None:
    model: object = EnvSpec
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        cands = [a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = cands[0] if cands else None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "float_type": "a number",
    "literal_error": None,
    "missing": None,
}


def _source_number(text: str, lines: dict[TomlPath, int], loc: TomlPath) -> str:
    """The number as the spec's text spells it at ``loc`` (``3.10``, where TOML reads 3.1), or ""."""
    line = _nearest_line(lines, loc)
    rows = text.splitlines()
    if not loc or not line or line > len(rows):
        return ""
    src = rows[line - 1]
    m = re.match(rf"\s*{re.escape(str(loc[-1]))}\s*=\s*([-+0-9._eE]+)\s*(#.*)?$", src)
    return m.group(1) if m else ""


def _problem_from_pydantic(
    err: ErrorDetails, lines: dict[TomlPath, int], text: str = ""
) -> Problem:
    loc = tuple(err["loc"])
    etype = err["type"]
    path = toml_path(loc)
    line = _nearest_line(lines, loc)
    hint = ""
    ref = "invalid-value"
    if etype == "extra_forbidden":
        parent = _model_at(loc[:-1])
        key = str(loc[-1])
        known = sorted(parent.model_fields) if parent else []
        import difflib  # only for a bad spec's suggestion: kept off the path of a good one

        close = difflib.get_close_matches(key, known, n=1)
        msg = f"unknown key '{key}'"
        hint = (
            f"did you mean '{close[0]}'?"
            if close
            else (f"known keys here: {', '.join(known)}" if known else "")
        )
        ref = "unknown-key"
    elif etype == "missing":
        msg = f"required key '{loc[-1]}' is missing"
        ref = "missing-key"
        hint = 'add it, e.g. name = "my-env"' if loc == ("name",) else ""
    elif etype == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        msg = f"{err['input']!r} is not allowed; expected {expected}"
    elif etype in _TYPE_WORDS and _TYPE_WORDS[etype]:
        got = err.get("input")
        msg = f"expected {_TYPE_WORDS[etype]}, got {_toml_type(got)} {got!r}"
        ref = "wrong-type"
        if etype == "string_type" and isinstance(got, (int, float)) and not isinstance(got, bool):
            # TOML reads 3.10 as the number 3.1: a version must be quoted, or its last zero is lost
            spelled = _source_number(text, lines, loc)
            hint = f'quote it: {loc[-1]} = "{spelled or got}"' + (
                f" (unquoted, {spelled} is the number {got!r})"
                if isinstance(got, float) and spelled not in ("", repr(got))
                else ""
            )
    elif etype in ("greater_than_equal", "less_than_equal"):
        msg = f"{err['input']!r} is out of range: {err['msg'].lower()}"
    elif etype == "value_error":
        msg = str(err.get("ctx", {}).get("error", err["msg"]))
        m = re.match(r"item (\d+): (.*)", msg, re.S)
        if m:
            loc = loc + (int(m.group(1)),)
            path, line, msg = toml_path(loc), _nearest_line(lines, loc), m.group(2)
        msg = msg.splitlines()[0]
    else:
        msg = err["msg"]
    return Problem(msg, path=path, line=line, hint=hint, reference=ref)


def _toml_type(v: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        list: "array",
        dict: "table",
    }.get(type(v), type(v).__name__)


def _cross_checks(spec: EnvSpec, file: Path) -> list[Problem]:
    """What no one table can check alone: keys that contradict each other, files the spec names."""
    return [
        *_package_checks(spec),
        *_combination_checks(spec),
        *_platform_checks(spec),
        *_service_checks(spec, file),
        *_base_and_torch_checks(spec),
    ]


def _package_checks(spec: EnvSpec) -> list[Problem]:
    """[python].packages: torch and its family are [torch]'s, each package named once."""
    out: list[Problem] = []
    torch_names = {"torch"} | {
        requirement_name(r) for r in (spec.torch.packages if spec.torch else [])
    }
    seen: dict[str, int] = {}
    for i, r in enumerate(spec.python.packages):
        name = requirement_name(r)
        if name in torch_names and spec.torch is not None:
            out.append(
                spec.problem(
                    ("python", "packages", i),
                    f"'{name}' is set by [torch]; a second pin here would conflict",
                    hint="put torch's version in [torch].version and torch-family packages in [torch].packages",
                    reference="conflicting-pins",
                )
            )
        elif name == "torch" and spec.torch is None:
            out.append(
                spec.problem(
                    ("python", "packages", i),
                    "torch belongs in a [torch] table",
                    hint='add [torch] with version = "..." so envspec can choose its CUDA build',
                    reference="conflicting-pins",
                )
            )
        if name in seen:
            out.append(
                spec.problem(
                    ("python", "packages", i),
                    f"'{name}' is listed twice (also item {seen[name]})",
                    hint="merge the two requirements into one",
                    reference="conflicting-pins",
                )
            )
        seen.setdefault(name, i)
    return out


def _combination_checks(spec: EnvSpec) -> list[Problem]:
    """GPU targets without torch, a driver floor for a CPU build."""
    out: list[Problem] = []
    if spec.torch is None and spec.target.gpus:
        out.append(
            spec.problem(
                ("target", "gpus"),
                "GPU targets are given but there is no [torch] table",
                hint="add [torch] or remove [target].gpus",
                reference="impossible-combination",
            )
        )
    if spec.torch is not None and spec.torch.cuda == "cpu" and spec.target.driver:
        out.append(
            spec.problem(
                ("target", "driver"),
                "a driver floor is given for a CPU build of torch",
                hint='set [torch].cuda = "auto" or drop [target].driver',
                reference="impossible-combination",
            )
        )
    return out


def _platform_checks(spec: EnvSpec) -> list[Problem]:
    """[target].platforms: known names, each once."""
    out: list[Problem] = []
    plats = spec.target.platforms
    dup = next((i for i, p in enumerate(plats) if p in plats[:i]), None)
    bad = next((i for i, p in enumerate(plats) if p not in PLATFORM_NAMES), None)
    if bad is not None:
        arm = any(w in plats[bad].lower() for w in ("arm", "aarch", "grace"))
        out.append(
            spec.problem(
                ("target", "platforms", bad),
                f"{plats[bad]!r} is not a platform envspec locks for; "
                "expected " + " or ".join(repr(n) for n in PLATFORM_NAMES),
                hint=f"did you mean '{PLATFORM_NAMES[1] if arm else PLATFORM_NAMES[0]}'?",
                reference="unknown-platform",
            )
        )
    elif dup is not None:
        out.append(
            spec.problem(
                ("target", "platforms", dup),
                f"{plats[dup]!r} is listed twice",
                hint="name each platform once",
                reference="invalid-value",
            )
        )
    return out


def _service_checks(spec: EnvSpec, file: Path) -> list[Problem]:
    """The services' ports apart, the authorized keys file there (relative to the spec)."""
    out: list[Problem] = []
    j, s = spec.services.jupyter, spec.services.ssh
    if j and s and j.enabled and s.enabled and j.port == s.port:
        out.append(
            spec.problem(
                ("services", "ssh", "port"),
                f"port {s.port} is also [services.jupyter].port",
                hint="give each service its own port",
                reference="port-clash",
            )
        )
    if s and s.enabled and s.authorized_keys:
        keyfile = (
            (file.parent / s.authorized_keys)
            if not Path(s.authorized_keys).is_absolute()
            else Path(s.authorized_keys)
        )
        if not keyfile.is_file():
            out.append(
                spec.problem(
                    ("services", "ssh", "authorized_keys"),
                    f"no such file: {keyfile}",
                    hint="the path is relative to the spec; or leave it empty and pass keys at run time "
                    "in ENVSPEC_AUTHORIZED_KEYS",
                    reference="missing-file",
                )
            )
    return out


def _base_and_torch_checks(spec: EnvSpec) -> list[Problem]:
    """Debian packages need a Debian base; [torch].version names a version."""
    out: list[Problem] = []
    if spec.system.base == "none" and spec.system.packages:
        out.append(
            spec.problem(
                ("system", "packages"),
                'Debian packages are given but [system].base = "none"',
                hint='use base = "auto"',
                reference="impossible-combination",
            )
        )
    if spec.torch is not None and spec.torch.version != "*":
        try:
            for sp in spec.torch.specifier():
                v = sp.version.rstrip(".*")
                Version(v)
        except InvalidVersion:
            out.append(
                spec.problem(
                    ("torch", "version"),
                    f"{spec.torch.version!r} names no valid version",
                    reference="invalid-value",
                )
            )
    return out
