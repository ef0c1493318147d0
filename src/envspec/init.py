"""`envspec init`: a commented spec from a few answers (GPUs, driver, torch, Python, packages),
checked by the spec's own parser before it is written, so that it locks as written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from envspec.spec import EnvSpec, parse_spec

COMMENT_COLUMN = 27  # where the keys' comments start


@dataclass(frozen=True)
class Answers:
    """What `envspec init` asks (each has a default but the GPUs)."""

    name: str
    gpus: tuple[str, ...] = ()  # empty: a CPU image
    driver: str = ""  # the hosts' oldest driver; empty: left out (explain says what is assumed)
    torch: str = "*"
    python: str = "3.11"
    packages: tuple[str, ...] = ()


def spec_text(a: Answers, path: Path, lock: Path) -> str:
    """The spec's text: every key commented, the values given."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    values = {
        "name": a.name,
        "path": str(path),
        "lock": str(lock),
        "description": f"PyTorch on {', '.join(a.gpus)}" if a.gpus else "PyTorch on CPUs",
        "gpus": ", ".join(json.dumps(g) for g in a.gpus),
        "driver": a.driver,
        "python": a.python,
        "packages": ", ".join(json.dumps(p) for p in a.packages),
        "torch": a.torch,
        "cuda": "auto" if a.gpus else "cpu",
        "tf32": "true" if a.gpus else "false",
        "shm": "16g" if a.gpus else "1g",
    }
    lines = {
        "gpus": f"gpus = [{values['gpus']}]",
        "driver": f'driver = "{a.driver}"',
        "python": f'version = "{a.python}"',
        "packages": f"packages = [{values['packages']}]",
        "torch": f'version = "{a.torch}"',
        "cuda": f'cuda = "{values["cuda"]}"',
        "tf32": f"tf32 = {values['tf32']}",
        "shm": f'shm_size = "{values["shm"]}"',
    }
    pads = {f"pad_{k}": " " * max(1, COMMENT_COLUMN - len(v)) for k, v in lines.items()}
    env = Environment(
        loader=PackageLoader("envspec", "templates"),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env.get_template("spec.toml.j2").render(**values, **pads)


def make_spec(a: Answers, path: Path, lock: Path) -> tuple[str, EnvSpec]:
    """The text and the spec it parses to; raises ``SpecError`` (every problem, with the line of
    the text) where an answer is not one a spec takes: a GPU the DB does not know, a bad version."""
    text = spec_text(a, path, lock)
    spec = parse_spec(text, str(path))
    from envspec.compat import load_db
    from envspec.resolve import choose_all

    choose_all(
        spec, load_db()
    )  # the GPUs, driver, Python and torch must fit together, as explain says
    return text, spec


__all__ = ["Answers", "make_spec", "spec_text"]
