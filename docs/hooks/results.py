"""mkdocs hook: inline tables from the lab's results/ into the pages, never typed by hand.

A line `<!-- results: demo/quality.md -->` in a page is replaced by that file under
packages/specdec-jax-lab/results/ (its first `# ` title dropped). Images the file links to are published with the
site and their links rewritten relative to the page. A missing file fails the build: the
tables are rebuilt by `python -m specdec_jax_lab.results`.
"""

from __future__ import annotations

import pathlib
import posixpath
import re

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "packages" / "specdec-jax-lab" / "results"     # the lab's tables
MARKER = re.compile(r"^<!-- results: (?P<path>[\w./-]+\.md) -->$", re.MULTILINE)
IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)\)")


def _table(rel: str) -> tuple[str, list[str]]:
  """The Markdown of results/`rel` without its title, and the images it links (results-relative)."""
  path = (RESULTS / rel).resolve()
  if RESULTS.resolve() not in path.parents or not path.is_file():
    raise PluginError(f"results/{rel} is missing: rebuild it with "
                      "`python -m specdec_jax_lab.results` (see docs/benchmarks.md)")
  lines = path.read_text().splitlines()
  if lines and lines[0].startswith("# "):
    lines = lines[1:]
  text = "\n".join(lines).strip() + "\n"
  images = []

  def rebase(m: re.Match) -> str:
    src = posixpath.normpath(posixpath.join(posixpath.dirname(rel), m["src"]))
    if not (RESULTS / src).is_file():
      raise PluginError(f"results/{rel} links a missing image: results/{src}")
    images.append(src)
    return f"![{m['alt']}](@results/{src})"
  return IMAGE.sub(rebase, text), images


def on_files(files, config):
  """Publish every image under results/ at site/results/..."""
  for png in sorted(RESULTS.rglob("*.png")):
    rel = png.relative_to(RESULTS).as_posix()
    files.append(File.generated(config, f"results/{rel}", abs_src_path=str(png)))
  return files


def on_page_markdown(markdown, page, config, files):
  page_dir = posixpath.dirname(page.file.src_uri)

  def include(m: re.Match) -> str:
    text, _ = _table(m["path"])
    return text.replace("](@results/",
                        "](" + posixpath.relpath("results", page_dir or ".") + "/")
  return MARKER.sub(include, markdown)
