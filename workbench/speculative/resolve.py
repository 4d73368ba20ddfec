"""One way to name a drafter, in every notebook and function that takes one.

``"auto"``: the shipped drafter for the embedded default policy; for any other model one fitted
on the spot (``speculative.fit``) and cached under the model's fingerprint
(``speculative.cache``), so the next run reuses it. A folder: an EAGLE head saved by
``EagleHead.save_pretrained``, or a small causal LM saved by ``save_pretrained`` with the
policy's tokenizer. A registered name (``speculative.drafters.DRAFTERS``): the built-ins
``"ngram"`` (prompt lookup, model-free) and ``"sibling"`` (drafts from the other responses to
the same prompt: ``speculative.sibling``, model-free), and every name a plugin registers
(docs/extending.md), built by its class's ``build(policy, tokenizer)``. ``"none"``: no
drafter, where the caller can run without SD. Every name is checked (:func:`drafter_form`)
before anything runs; an error lists the registered names.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..atomic import recover_dir
from ..checks import check_choice
from ..models import DEFAULT_EAGLE, load_model, resolve_model_path
from .cache import fitted_dir, is_default_policy, model_fingerprint
# DRAFTERS holds "sibling" too: the package (speculative/__init__) imports speculative.sibling
from .drafters import DRAFTERS, EagleDrafter, LMDrafter
from .eagle import EagleHead
from .fit import FIT_KINDS, KIND_LABELS, FitConfig, fit_drafter_lm, fit_eagle, fitted_from

__all__ = ["drafter_form", "auto_drafter", "resolve_drafter", "resolve_head", "comparison_names",
           "compared_drafters", "check_head_spec"]

FOLDER_FORMS = ("a folder saved by EagleHead.save_pretrained",
                "a folder holding a small causal LM with the policy's tokenizer (save_pretrained)")
# what a comparison puts beside the named drafter unless told (any of other_drafter_names())
DEFAULT_OTHERS = ("ngram", "small_lm")
_NAMES = {"auto": "eagle", "eagle": "eagle", "lm": "small_lm"}  # form -> comparison name


def keywords() -> list[str]:
    """The names :func:`drafter_form` takes: ``"auto"``, every registered drafter (the
    built-ins, then the plugins'), ``"none"``."""
    return ["auto", *DRAFTERS.names(), "none"]


def other_drafter_names() -> list[str]:
    """What a comparison may put beside the named drafter: every registered drafter and
    ``"small_lm"`` (the ``"auto"`` small LM)."""
    return [*DRAFTERS.names(), "small_lm"]


def _accepted(allow_none: bool) -> str:
    names = [f"{n!r}" for n in keywords() if allow_none or n != "none"]
    return ", ".join([*names, *FOLDER_FORMS])


def drafter_form(spec, allow_none: bool = True) -> str:
    """What ``spec`` names: ``"auto"``, a registered drafter's name (``"ngram"``,
    ``"sibling"``, a plugin's), ``"none"``, ``"eagle"`` (a head's folder) or ``"lm"`` (a small
    LM's folder). A ``ValueError`` names a bad value and the accepted forms (the registered
    names among them); ``allow_none=False`` where the caller cannot run without a drafter."""
    if isinstance(spec, str) and spec in keywords():
        if spec == "none" and not allow_none:
            raise ValueError(f"drafter 'none': this run needs a drafter; accepted here: "
                             f"{_accepted(False)}")
        return spec
    if not isinstance(spec, (str, os.PathLike)) or not str(spec):
        raise ValueError(f"drafter {spec!r} is not a name or a folder; accepted: "
                         f"{_accepted(allow_none)}")
    path = Path(spec).expanduser()
    recover_dir(path)  # a save interrupted between its two renames left the folder aside
    if (path / "eagle_config.json").is_file():
        return "eagle"
    if (path / "config.json").is_file():
        return "lm"
    why = ("is a folder without eagle_config.json or config.json" if path.is_dir()
           else "is a file" if path.exists() else "does not exist")
    raise ValueError(f"drafter {str(spec)!r} is not one of {keywords()}, and as a path it "
                     f"{why}; accepted: {_accepted(allow_none)}")


def drafter_name(spec) -> str:
    """The name a comparison gives the drafter ``spec`` names: ``"eagle"`` (``"auto"`` or a
    head's folder), ``"small_lm"`` (a small LM's folder), or the registered name itself."""
    form = drafter_form(spec, allow_none=False)
    return _NAMES.get(form, form)


def auto_drafter(policy, tokenizer, task="running_sum", kind: str = "eagle",
                 fit: FitConfig | None = None, cache_root=None, refit: bool = False,
                 progress: bool = True) -> Path:
    """The folder of the ``"auto"`` drafter of ``kind`` (``"eagle"`` or ``"lm"``) for
    ``policy``: the shipped one when ``policy`` is the embedded default model; else the one
    cached for this model and ``task`` (one printed line says it is reused), or, when there is
    none or ``refit``, one fitted now (``fit``: the budget and prompts) into the cache."""
    check_choice("drafter kind", kind, FIT_KINDS)
    fingerprint = model_fingerprint(policy)
    if is_default_policy(fingerprint):
        return DEFAULT_EAGLE if kind == "eagle" else resolve_model_path("default-drafter")
    folder = fitted_dir(fingerprint, kind, task, cache_root)
    if not refit and (folder / "provenance.json").is_file():
        found = fitted_from(folder)
        p = found.provenance
        print(f"reusing the {KIND_LABELS[kind]} fitted to model {fingerprint} on task "
              f"{p['task_key']} ({p['minutes']:g} min, {found.steps} steps, tau "
              f"{found.tau:.2f}): {folder}", flush=True)
        return folder
    fitter = fit_eagle if kind == "eagle" else fit_drafter_lm
    fitter(policy, tokenizer, task, folder, fit, progress=progress)
    return folder


def load_drafter(path, policy, tokenizer):
    """The drafter saved in ``path`` (an EAGLE head or a small LM), on ``policy``'s device and
    dtype."""
    if drafter_form(path) == "eagle":
        return EagleDrafter(EagleHead.from_pretrained(path, policy), policy)
    weight = policy.get_output_embeddings().weight
    model, _ = load_model(path, device=weight.device, dtype=weight.dtype)
    return LMDrafter(model, tokenizer)


def resolve_drafter(spec, policy, tokenizer, task="running_sum", *, kind: str = "eagle",
                    allow_none: bool = True, fit: FitConfig | None = None, cache_root=None,
                    progress: bool = True):
    """The drafter ``spec`` names for ``policy`` (None for ``"none"``); ``"auto"`` is the
    ``kind`` drafter of :func:`auto_drafter`; a registered name, its class's
    ``build(policy, tokenizer)``. Nothing is loaded or trained for a bad name."""
    form = drafter_form(spec, allow_none)
    check_choice("drafter kind", kind, FIT_KINDS)
    if form == "none":
        return None
    if form in DRAFTERS:
        return DRAFTERS[form].build(policy, tokenizer)
    path = (auto_drafter(policy, tokenizer, task, kind, fit, cache_root, progress=progress)
            if form == "auto" else Path(spec).expanduser())
    return load_drafter(path, policy, tokenizer)


def check_head_spec(spec) -> str:
    """``spec``'s form when it names an EAGLE head (``"auto"`` or a head's folder), for RL:
    its adaptive drafter trains an EAGLE head, so the other forms are refused."""
    form = drafter_form(spec)
    if form not in ("auto", "eagle"):
        raise ValueError(f"drafter {str(spec)!r}: speculative RL variants need an EAGLE head "
                         "(the adaptive drafter trains one); accepted: 'auto' or a folder saved "
                         "by EagleHead.save_pretrained ('none' only when every variant is "
                         "'baseline')")
    return form


def resolve_head(spec, policy, tokenizer, task="running_sum", fit: FitConfig | None = None,
                 cache_root=None, progress: bool = True) -> EagleHead:
    """The EAGLE head ``spec`` names (:func:`check_head_spec`, before anything runs)."""
    form = check_head_spec(spec)
    path = (auto_drafter(policy, tokenizer, task, "eagle", fit, cache_root, progress=progress)
            if form == "auto" else Path(spec).expanduser())
    return EagleHead.from_pretrained(path, policy)


def comparison_names(spec, others=DEFAULT_OTHERS) -> list[str]:
    """The names of a comparison's drafters, the one ``spec`` names first
    (:func:`drafter_name`), then each of ``others`` not already there; both checked before
    anything loads. ``"none"`` is refused: there is nothing to compare without a drafter.
    ``others`` may name any of :func:`other_drafter_names` (a plugin's drafter too)."""
    accepted = other_drafter_names()
    if isinstance(others, str) or any(not isinstance(o, str) or o not in accepted
                                      for o in others):
        raise ValueError(f"other drafters {others!r}: accepted a list of {accepted} (a plugin "
                         "registers more: docs/extending.md)")
    return list(dict.fromkeys([drafter_name(spec), *others]))


def compared_drafters(spec, policy, tokenizer, task="running_sum", others=DEFAULT_OTHERS,
                      fit: FitConfig | None = None, cache_root=None,
                      progress: bool = True) -> dict:
    """``{name: drafter}`` of :func:`comparison_names`: the drafter ``spec`` names, then each
    of ``others``: a registered drafter (``"ngram"``: prompt lookup, ``"sibling"``: siblings'
    responses, a plugin's) or ``"small_lm"`` (the ``"auto"`` small LM)."""
    main, *rest = comparison_names(spec, others)
    common = dict(fit=fit, cache_root=cache_root, progress=progress)
    out = {main: resolve_drafter(spec, policy, tokenizer, task, allow_none=False, **common)}
    for name in rest:
        out[name] = resolve_drafter(name if name in DRAFTERS else "auto", policy, tokenizer,
                                    task, kind="lm", **common)
    return out
