"""The documentation site: ``mkdocs build --strict`` of ``mkdocs.yml`` (the docs beside the API
reference that mkdocstrings generates from the docstrings, a page per subpackage) passes, so a
broken link or cross-reference fails here; every public name has a docstring (``--strict``
does not check that); and the built site's index and one API page render in headless Chromium,
with screenshots in test-artifacts/test_the_site_renders_in_chromium/.

The site is built once per session (``tests/docs_site.py``); tests/test_public_api.py reads the
same build for the names it documents."""
from __future__ import annotations

import importlib
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from .browser import artifacts_dir, launch, require_chromium, screenshot
from .docs_site import ROOT, built_site, documented_modules, require_docs_tools


@pytest.fixture(scope="module")
def site():
    return built_site()


def test_the_site_builds_with_strict(site):
    """A warning (a link to a missing page, an unresolved cross-reference, a docstring griffe
    cannot read) aborts a strict build."""
    assert site.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        site.warnings() or site.output.splitlines()[-30:])
    assert (site.folder / "index.html").is_file()
    print(f"docs build: {site.seconds:.1f} s")


def test_every_doc_is_in_the_nav():
    """The docs beside the reference (architecture, design, extending, the trace formats...)
    and every API page are reachable from the site's navigation."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav) -> set[str]:
        found = set()
        for item in nav:
            values = item.values() if isinstance(item, dict) else [item]
            for value in values:
                found |= pages(value) if isinstance(value, list) else {value}
        return found

    in_nav = pages(config["nav"])
    docs = ROOT / "docs"
    wanted = {p.name for p in docs.glob("*.md")} | {
        f"api/{p.name}" for p in (docs / "api").glob("*.md")}
    assert wanted - in_nav == set(), "add these to mkdocs.yml's nav"
    assert {"architecture.md", "design.md", "extending.md", "chrome_trace.md",
            "trace_format.md", "api/rollout.md"} <= in_nav


def test_every_subpackage_has_its_api_page():
    pages = set(documented_modules().values())
    for package in ("rollout", "speculative", "rl", "adapt", "compress", "cluster", "diagnose",
                    "viz", "tasks", "zoo"):
        assert f"{package}.md" in pages, package
        assert all(page == f"{package}.md" for module, page in documented_modules().items()
                   if module == f"workbench.{package}" or module.startswith(f"workbench.{package}.")
                   ), f"a module of workbench.{package} is documented on another page"


def test_every_public_name_has_a_docstring():
    """Each name a documented module's ``__all__`` exports has a docstring, as the reference
    reads it (griffe, statically: a constant's docstring is the string after it)."""
    require_docs_tools()
    import griffe

    package = griffe.load("workbench", search_paths=[str(ROOT)], resolve_aliases=False)
    missing = []
    for module in documented_modules():
        mod = importlib.import_module(module)
        for name in mod.__all__:
            path = f"{module}.{name}"
            try:
                obj = package[path.removeprefix("workbench.")]
            except KeyError:  # made on first use (a module __getattr__): found where it lives
                value = getattr(mod, name)
                path = f"{value.__module__}.{value.__qualname__}"
                obj = package[path.removeprefix("workbench.")]
            target = obj.final_target if obj.is_alias else obj
            if not (target.docstring and target.docstring.value.strip()):
                missing.append(f"{path} ({target.kind.value}, {target.relative_filepath}:"
                               f"{target.lineno})")
    assert missing == [], "public names without a docstring:\n" + "\n".join(missing)


def test_a_link_out_of_the_docs_becomes_the_repository_path(caplog):
    """The build's hook (docs/hooks/repo_links.py): a link to a file of the repository that
    the site has no copy of becomes the path in the text; one to a missing file warns."""
    spec = importlib.util.spec_from_file_location("repo_links",
                                                  ROOT / "docs" / "hooks" / "repo_links.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = SimpleNamespace(file=SimpleNamespace(src_uri="extending.md"))
    config = {"docs_dir": str(ROOT / "docs")}
    text = ("[`tests/plugins/shortest_first.py`](../tests/plugins/shortest_first.py), "
            "[the design](design.md), [a site](https://example.org/x), "
            "[gone](../tests/plugins/no_such_file.py)")
    with caplog.at_level("WARNING"):
        out = hook.on_page_markdown(text, page, config, None)
    assert out.startswith("`tests/plugins/shortest_first.py`, [the design](design.md), "
                          "[a site](https://example.org/x), ")
    assert "[gone](../tests/plugins/no_such_file.py)" in out
    assert "no_such_file.py" in caplog.text


def test_the_site_renders_in_chromium(site, request):
    """The index (its figure loaded, the theme's styles applied) and the rollout API page (the
    engine documented with its docstring, the navigation listing the reference's pages)."""
    require_chromium()  # skip or fail before anything else
    assert site.returncode == 0, "the build failed: see test_the_site_builds_with_strict"
    started = time.monotonic()
    folder = artifacts_dir(request.node.name)
    with launch(viewport=(1280, 900)) as page:
        page.goto((site.folder / "index.html").as_uri())
        page.wait_for_load_state("load")
        index_shot = screenshot(page, folder, "index")
        title = page.inner_text("article h1")
        images = page.eval_on_selector_all(
            "article img", "els => els.map(i => [i.complete, i.naturalWidth])")
        header = page.eval_on_selector(
            "header.md-header", "e => getComputedStyle(e).backgroundColor")
        nav = page.inner_text("nav.md-nav--primary")

        # at the engine's entry (the theme keeps an anchor's heading clear of its header)
        page.goto((site.folder / "api" / "rollout.html").as_uri()
                  + "#workbench.rollout.RolloutEngine")
        page.wait_for_load_state("load")
        engine = page.locator('[id="workbench.rollout.RolloutEngine"]')
        api_shot = screenshot(page, folder, "api_rollout")
        api_title = page.inner_text("article h1")
        heading = engine.inner_text()
        doc = page.locator('[id="workbench.rollout.RolloutEngine"] ~ div.doc-contents').first
        doc_text = doc.inner_text()
        width = page.evaluate("document.documentElement.scrollWidth")
    assert index_shot.stat().st_size > 0 and api_shot.stat().st_size > 0
    assert title.startswith("workbench")
    assert images and all(done and w > 0 for done, w in images), images
    assert header not in ("", "rgba(0, 0, 0, 0)", "transparent"), "the theme's CSS did not load"
    for entry in ("Architecture", "Design", "Extending", "Lab notes", "API reference"):
        assert entry in nav, (entry, nav)
    assert api_title.startswith("workbench.rollout")
    assert "RolloutEngine" in heading
    assert "rollout" in doc_text.lower() and len(doc_text) > 200, doc_text[:300]
    assert width <= 1280, f"the API page is {width} px wide"
    print(f"docs site browser check: {time.monotonic() - started:.1f} s")
