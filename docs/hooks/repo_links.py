"""The mkdocs build's hooks. A link from a page to a file of the repository outside ``docs/``
(a test's plugin, a benchmark) becomes the file's path in the text, since the site has no copy
of it; a link to a path that does not exist stays a warning, so ``mkdocs build --strict`` fails
on it. A Sphinx role before a code span in a docstring is dropped."""
from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.repo_links")

LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")


def on_page_markdown(markdown, page, config, files):
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    here = posixpath.dirname(page.file.src_uri)

    def replace(match: re.Match) -> str:
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
            return match[0]  # a URL, an anchor on the page, an absolute path
        path = target.split("#", 1)[0]
        resolved = (docs / here / path).resolve()
        if resolved.is_relative_to(docs):
            return match[0]  # a page or file of the site: mkdocs checks it
        if not resolved.exists():
            log.warning(f"Doc file '{page.file.src_uri}' links to '{target}', which is not in "
                        "the repository")
            return match[0]
        relative = resolved.relative_to(root).as_posix()
        text = match["text"]
        return text if relative in text else f"{text} (`{relative}` in the repository)"

    return LINK.sub(replace, markdown)


# a Sphinx role before a code span in a docstring (``:class:`Timeline```): the reference shows
# the code span alone
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):(?=<code>)")


def on_page_content(html, page, config, files):
    return ROLE.sub("", html)
