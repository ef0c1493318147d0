from pathlib import Path

import pytest

from envspec.errors import SpecError
from envspec.spec import load_spec, parse_spec, toml_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["h100", "a100", "b200", "cpu", "smoke", "h200-host"])
def test_shipped_specs_parse(name):
    spec = load_spec(ROOT / "specs" / f"{name}.toml")
    assert spec.name
    assert spec.spec_hash().startswith("sha256:")


def test_h100_fixed_keys():
    s = load_spec(ROOT / "specs" / "h100.toml")
    assert s.target.gpus == ["H100"]
    assert s.target.driver_policy == "compat"
    assert s.torch.version == "==2.14.*" and s.torch.cuda == "auto"
    assert s.python.version == "3.11"


def test_every_problem_at_once_with_lines():
    text = 'name = "x"\n[target]\ndrivr = "1"\n[python]\nversion = 3.11\npackages = ["a", "b c"]\n'
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "t.toml")
    probs = ei.value.problems()
    assert [(p.path, p.line) for p in probs] == [
        ("[target].drivr", 3),
        ("[python].version", 5),
        ("[python].packages[1]", 6),
    ]
    assert "did you mean 'driver'" in ei.value.message


def test_multiline_array_item_lines():
    text = 'name = "x"\n[python]\npackages = [\n  "a",\n  "b",\n  "c d e",\n]\n'
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "t.toml")
    assert ei.value.problems()[0].line == 6


def test_spec_hash_ignores_mirrors_and_description():
    base = 'name = "x"\n[python]\npackages = ["six"]\n'
    a = parse_spec(base, "a.toml")
    b = parse_spec(
        'description = "other"\n' + base + '[sources]\nmirrors = ["file:///srv/m"]\n', "b.toml"
    )
    c = parse_spec(base.replace("six", "idna"), "c.toml")
    assert a.spec_hash() == b.spec_hash() != c.spec_hash()


def test_spec_hash_is_stable():
    # golden: the hash covers a fixed, documented set of fields (docs/lockfile.md); a change re-locks everyone
    assert (
        parse_spec('name = "stable"\n', "s.toml").spec_hash()
        == "sha256:df57879c2e22835a525e40232a16971a73af50d8cd14ff4b7eb16bcc122beb64"
    )


def test_toml_path():
    assert toml_path(("target", "gpus", 0)) == "[target].gpus[0]"
    assert toml_path(("services", "ssh", "port")) == "[services.ssh].port"
    assert toml_path(("name",)) == "name"
    assert toml_path(("runtime", "env")) == "[runtime].env"


def _generated_requirements(n: int, seed: int) -> list[str]:
    """Strings near the simple form: names of PEP 508 characters and a few more, version clauses
    with every operator and some broken ones, commas, spaces, stars, extras and markers."""
    import random

    rnd = random.Random(seed)
    ops = ["==", "!=", "<=", ">=", "<", ">", "~=", "===", "=", "!", "~", ""]
    out = []
    for _ in range(n):
        name = "".join(rnd.choice("abcXYZ019._-") for _ in range(rnd.randint(1, 6)))
        clauses = [
            rnd.choice(ops) + "".join(rnd.choice("0123456789.*") for _ in range(rnd.randint(0, 5)))
            for _ in range(rnd.randint(0, 3))
        ]
        tail = rnd.choice(
            ["", "", "", " ", "[x]", "; python_version>'3'", ",", " @ https://e.x/a.whl"]
        )
        out.append(name + rnd.choice([",", ",", ", ", " "]).join(clauses) + tail)
    return out


def test_simple_requirements_are_what_packaging_accepts_with_the_same_name():
    # envspec.spec checks "name" + version clauses without packaging's parser: each string it takes
    # that way must be one packaging accepts, naming the same project; any other goes to packaging
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    from envspec.spec import _SIMPLE_REQUIREMENT, requirement_name

    simple = 0
    corpus = _generated_requirements(20000, seed=12) + [
        "numpy>=2",
        "einops>=0.8,<1",
        "torchvision==0.29.*",
        "Foo_Bar.baz>=1",
        "a",
        "numpy~=1.2",
        "x!=1.*",
        "numpy<=1.0.0.0,>1,!=1.5",
        "requests[socks]>=2",
        "numpy ; python_version > '3.8'",
        "numpy >= 2",
    ]
    for text in corpus:
        try:
            want = canonicalize_name(Requirement(text).name)
        except InvalidRequirement:
            want = None
        if _SIMPLE_REQUIREMENT.fullmatch(text):
            simple += 1
            assert want is not None, f"{text!r} taken as simple, but packaging refuses it"
        if want is None:
            with pytest.raises(InvalidRequirement):
                requirement_name(text)
        else:
            assert requirement_name(text) == want, text
    assert simple > 1000  # the generator reaches the simple form often (1,540 of these)


@pytest.mark.parametrize(
    "packages,where,message",
    [
        (
            ["numpy>=2,,<3"],
            0,
            "'numpy>=2,,<3' is not a PEP 508 requirement (Expected comma (within version specifier)",
        ),
        (
            ["numpy>=2.*"],
            0,
            "'numpy>=2.*' is not a PEP 508 requirement (.* suffix can only be used with `==` or `!=`",
        ),
        (
            ["numpy", "Num_Py.>=1"],
            1,
            "'Num_Py.>=1' is not a PEP 508 requirement (Expected semicolon (after name",
        ),
    ],
)
def test_requirements_that_are_not_simple_get_packagings_reason(packages, where, message):
    text = 'name = "x"\n[python]\npackages = ' + str(packages).replace("'", '"') + "\n"
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "t.toml")
    [p] = ei.value.problems()
    assert p.path == f"[python].packages[{where}]" and p.message.startswith(message), p.message


def test_package_names_are_compared_normalized():
    text = 'name = "x"\n[python]\npackages = ["Foo_Bar>=1", "foo.bar<3", "requests[socks]>=2", "Requests"]\n'
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "t.toml")
    assert [(p.path, p.message) for p in ei.value.problems()] == [
        ("[python].packages[1]", "'foo-bar' is listed twice (also item 0)"),
        ("[python].packages[3]", "'requests' is listed twice (also item 2)"),
    ]
