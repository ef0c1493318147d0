"""The two copies of the compute-capability rule agree: ``compat/arch.py`` (the resolver's) and the
stdlib-only ``verify/archrule.py`` (the verifier's, copied into images). Exhaustive over the compat
DB: every GPU against every arch list a torch variant has, then every entry the DB knows (the
toolkits' nvcc targets bring the ``a``/``f`` forms) alone, as SASS and as PTX. (hypothesis is not
a dependency; the set is finite and small.)"""

from __future__ import annotations

import pytest

from envspec.compat import CompatDB, Gpu, arch_runs, best_arch, load_db, why_arch
from envspec.verify import archrule

DB: CompatDB = load_db()
ARCH_LISTS: list[tuple[str, ...]] = sorted(
    {tuple(v.arch_list) for r in DB.torch_releases for v in r.variants.values()}
)
ENTRIES: list[str] = sorted(
    {e for lst in ARCH_LISTS for e in lst} | {e for t in DB.cuda_toolkits for e in t.archs}
)
SINGLES: list[list[str]] = [[e] for e in ENTRIES] + [
    [e.replace("sm_", "compute_", 1)] for e in ENTRIES
]


def _disagreements(gpu: Gpu, arch_list: list[str]) -> list[str]:
    """Every way the two rules answer differently for this GPU and list, in words."""
    out: list[str] = []
    cc = gpu.cc
    for e in arch_list:
        mine = arch_runs(cc, e)
        theirs = archrule.runs(archrule.parse_arch(e), archrule.parse_cc(cc))
        if mine != theirs:
            out.append(
                f"{gpu.name} ({cc}) {e}: compat says {'runs' if mine else 'does not run'}, "
                f"verify says {'runs' if theirs else 'does not run'}"
            )
    usable, kind = archrule.runnable_by(arch_list, cc)
    if usable != [e for e in arch_list if arch_runs(cc, e)]:
        out.append(f"{gpu.name} ({cc}) {arch_list}: runnable entries differ: verify {usable}")
    runs, _ = why_arch(cc, arch_list)
    if runs != (kind != "none"):
        out.append(f"{gpu.name} ({cc}) {arch_list}: compat runs={runs}, verify kind={kind}")
    best = best_arch(cc, arch_list)
    want = "sass" if best.startswith("sm_") else "ptx" if best.startswith("compute_") else "none"
    if want != kind:
        out.append(
            f"{gpu.name} ({cc}) {arch_list}: compat loads {best or 'nothing'}, verify says {kind}"
        )
    return out


def test_the_db_gives_both_rules_something_to_disagree_on():
    assert len(DB.gpus) >= 30 and len(ARCH_LISTS) >= 5
    assert any(e.endswith("a") for e in ENTRIES) and any(e.endswith("f") for e in ENTRIES)
    assert any(e.startswith("compute_") for lst in ARCH_LISTS for e in lst)


@pytest.mark.parametrize("gpu", DB.gpus, ids=lambda g: g.name)
def test_every_variants_arch_list(gpu):
    assert [d for lst in ARCH_LISTS for d in _disagreements(gpu, list(lst))] == []


@pytest.mark.parametrize("gpu", DB.gpus, ids=lambda g: g.name)
def test_every_known_entry_alone_as_sass_and_as_ptx(gpu):
    assert [d for lst in SINGLES for d in _disagreements(gpu, lst)] == []


def test_every_entry_reads_the_same():
    for e in [x for lst in SINGLES for x in lst]:
        assert archrule.parse_arch(e).text == e
