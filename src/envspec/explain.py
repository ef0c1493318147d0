"""The one place that words resolution results and causes: sentences, tables and JSON."""

from __future__ import annotations

from envspec.errors import ResolutionImpossible


def cause_sentence(c: dict) -> str:
    text = _sentence(c)
    return f"{c['where']}: {text}" if c.get("where") else text


def _sentence(c: dict) -> str:
    k = c.get("kind")
    if k == "arch-missing":
        archs = c.get("arch_list") or []
        shown = ", ".join(archs) if archs else "no CUDA architectures"
        sm = "sm_" + c["cc"].replace(".", "")
        return f"{c['gpu']} ({c['cc']}) needs {sm} SASS or PTX <= compute_{c['cc'].replace('.', '')}; {c['variant']} has {shown}"
    if k == "driver-too-old":
        return (f"driver {c['driver']} < {c['needed']}, the floor of CUDA {c['cuda']} under the "
                f"'{c['policy']}' policy")
    if k == "python-unsupported":
        return f"torch {c['torch']} has no wheels for Python {c['python']} (it has {', '.join(c['supported'])})"
    if k == "variant-not-requested":
        return f"{c['variant']} is not what [torch].cuda asks for ({c['wanted']})"
    if k == "arch-fits":
        return f"{c['gpu']}: {c['why']}"
    if k == "driver-floor":
        return f"driver >= {c['floor']} ({c['policy']})"
    if k == "cuda-not-offered":
        return f"no release in the range has a build for CUDA {c['wanted']} (offered: {', '.join(c['offered'])})"
    if k == "release-needs-review":
        return f"torch {c['torch']} needs review before it can be resolved: " + "; ".join(c.get("items", []))
    if k == "unknown-cuda":
        return f"CUDA {c['cuda']} is not in the compatibility DB"
    return c.get("text") or str(c)


def choice_json(choice) -> dict:
    """The fixed `envspec explain --json` shape for a successful choice."""
    t = choice.torch
    out = {
        "ok": True,
        "torch": t.release.version if t else None,
        "variant": t.variant.name if t else None,
        "cuda": (t.variant.cuda or None) if t else None,
        "cudnn": (t.variant.cudnn or None) if t else None,
        "nccl": (t.variant.nccl or None) if t else None,
        "arch_list": list(t.variant.arch_list) if t else [],
        "min_driver": (t.min_driver or None) if t else None,
        "driver_policy": choice.driver_policy,
        "python": choice.python,
        "candidates": [candidate_json(c) for c in t.candidates] if t else [],
        "gpus": [{"name": g.name, "cc": g.cc, "min_driver": g.min_driver or None, "host_arch": list(g.host_arch)}
                 for g in choice.gpus],
        "base": choice.base,
        "platform": choice.platform,
        "notes": list(choice.notes),
    }
    return out


def candidate_reason(c) -> str:
    return "; ".join(cause_sentence(f) for f in c.facts) or "fits"


def candidate_json(c) -> dict:
    return {"variant": c.variant, "cuda": c.cuda, "ok": c.ok, "reason": candidate_reason(c), "preferred": c.preferred}


def impossible_json(err: ResolutionImpossible) -> dict:
    return {
        "ok": False,
        "error": {
            "reference": err.reference,
            "message": err.message,
            "hint": err.hint,
            "causes": [cause_sentence(c) for c in err.causes],
        },
        "candidates": [candidate_json(c) for c in err.candidates],
    }


def choice_lines(choice) -> list[str]:
    """Human form: what was chosen and why, and every candidate with its reason."""
    t = choice.torch
    lines = [f"spec {choice.spec.name}: Python {choice.python} on {choice.base}, {choice.platform}"]
    if choice.gpus:
        lines.append("targets: " + ", ".join(f"{g.name} (sm_{g.cc.replace('.', '')}"
                                             + (f", driver >= R{g.min_driver}" if g.min_driver else "") + ")"
                                             for g in choice.gpus))
    lines += [f"note: {n}" for n in choice.notes]
    if t is None:
        lines.append("no torch in this spec")
        return lines
    v = t.variant
    lines.append(f"torch {t.release.version} {v.name}" + (f": CUDA {v.cuda}, cuDNN {v.cudnn or '-'}, NCCL {v.nccl or '-'}" if v.cuda else " (CPU build)"))
    if v.cuda:
        lines.append(f"arch list: {' '.join(v.arch_list)}")
        lines.append(f"driver floor: {t.min_driver} ({choice.driver_policy})")
    lines.append(f"candidates of torch {t.release.version}:")
    for c in t.candidates:
        mark = "*" if c.preferred else ("+" if c.ok else "-")
        lines.append(f"  {mark} {c.variant:<7} {candidate_reason(c)}")
    lines.append("(* chosen: PyPI's build when it fits, else the newest CUDA that fits)")
    return lines


def impossible_lines(err: ResolutionImpossible) -> list[str]:
    lines = [err.message + ":"]
    for c in err.causes:
        if c.get("kind") != "suggestion":
            lines.append("  - " + cause_sentence(c))
    sugg = [c["text"] for c in err.causes if c.get("kind") == "suggestion"]
    if sugg:
        lines.append("what would fit:")
        lines += ["  " + s for s in sugg]
    return lines
