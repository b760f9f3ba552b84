"""mkdocs hook: the lab's results pages, published with the site under lab/.

The measurements behind a user page live in the lab's distribution, as
packages/specdec-jax-lab/results/<topic>/README.md. A nav entry `lab/<topic>/README.md`
publishes that file. Pages link to each other by their paths in the repository (so the links
work where the repository is browsed too): a docs page to
`../packages/specdec-jax-lab/results/<topic>/README.md`, a lab page to `../../../../docs/x.md`.
The hook rewrites those links to the published pages; mkdocs then checks them as usual.
"""

from __future__ import annotations

import pathlib
import posixpath
import re

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB = "packages/specdec-jax-lab/results"
SITE = "lab"
LINK = re.compile(r"\]\((?P<target>[^)\s#]+\.md)(?P<anchor>#[^)\s]*)?\)")


def _nav_paths(nav) -> list[str]:
  """Every page path named in the nav (a list of strings and one-key dicts)."""
  if isinstance(nav, str):
    return [nav]
  if isinstance(nav, dict):
    return [p for value in nav.values() for p in _nav_paths(value)]
  if isinstance(nav, list):
    return [p for item in nav for p in _nav_paths(item)]
  return []


def on_files(files, config):
  """Publish the lab pages the nav names (lab/<topic>/README.md) from the lab's results."""
  for uri in _nav_paths(config["nav"]):
    if not uri.startswith(SITE + "/"):
      continue
    source = ROOT / LAB / uri[len(SITE) + 1:]
    if not source.is_file():
      raise PluginError(f"mkdocs.yml names {uri}, but {source.relative_to(ROOT)} is missing")
    files.append(File.generated(config, uri, abs_src_path=str(source)))
  return files


def _repository_path(src_uri: str) -> str:
  """Where a published page lives in the repository."""
  if src_uri.startswith(SITE + "/"):
    return f"{LAB}/{src_uri[len(SITE) + 1:]}"
  return f"docs/{src_uri}"


def _site_path(repo_path: str) -> str | None:
  """The published page of a repository path, if it is a docs page or a lab page."""
  if repo_path.startswith("docs/"):
    return repo_path[len("docs/"):]
  if repo_path.startswith(LAB + "/"):
    return f"{SITE}/{repo_path[len(LAB) + 1:]}"
  return None


def on_page_markdown(markdown, page, config, files):
  here = posixpath.dirname(_repository_path(page.file.src_uri))
  page_dir = posixpath.dirname(page.file.src_uri)

  def rewrite(m: re.Match) -> str:
    target = m["target"]
    if "://" in target or target.startswith("/"):
      return m[0]
    site = _site_path(posixpath.normpath(posixpath.join(here, target)))
    if site is None or not (site.startswith(SITE + "/") or page_dir.startswith(SITE)):
      return m[0]          # an ordinary link between docs pages: mkdocs checks it as it is
    return f"]({posixpath.relpath(site, page_dir or '.')}{m['anchor'] or ''})"
  return LINK.sub(rewrite, markdown)
