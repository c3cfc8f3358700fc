"""Every number of the README's Experiments table comes from docs/results.md.

docs/results.md's table "The README's figures" has one row per experiment with its command, date and machine.
Each number of a README row's "measured" cell must be in that experiment's row there; each number of its "what
it does" cell somewhere in docs/results.md. Numbers are compared by value (63.0% and 63 alike); digits inside
names (`Qwen2.5`, `r64`, `smollm2.py`) and code spans are not numbers here.
"""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])\d+(?:\.\d+)?")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def _read(*path):
  with open(os.path.join(ROOT, *path)) as f:
    return f.read()


def numbers(text: str) -> set[float]:
  """The numbers of a piece of markdown, by value; code spans, link targets and dates left out."""
  text = re.sub(r"`[^`]*`", " ", text)
  text = re.sub(r"\]\([^)]*\)", "]", text)
  text = DATE.sub(" ", text)
  return {float(m.replace(",", "")) for m in NUMBER.findall(text)}


def table(text: str, heading: str) -> list[list[str]]:
  """The rows (cells, stripped) of the first table after `heading`, header and rule left out."""
  lines = text[text.index(heading):].splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith("|"))
  rows = []
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
  return rows


def missing(readme: str, results: str) -> list[str]:
  """What the README's Experiments table quotes that docs/results.md does not hold, one line each."""
  ours = {row[0]: row for row in table(results, "## The README's figures")}
  everywhere = numbers(results)
  problems = []
  for name, does, measured in table(readme, "## Experiments"):
    row = ours.get(name)
    if row is None:
      problems.append(f"{name}: no row in docs/results.md's table \"The README's figures\"")
      continue
    _, result, command, date, machine = row
    if not (command and DATE.search(date) and machine):
      problems.append(f"{name}: its docs/results.md row needs a command, a date (YYYY-MM-DD) and a machine")
    for value in sorted(numbers(measured) - numbers(result)):
      problems.append(f"{name}: the README's measured {value:g} is not in its docs/results.md row")
    for value in sorted(numbers(does) - everywhere):
      problems.append(f"{name}: the README's {value:g} (what it does) is nowhere in docs/results.md")
  return problems


def test_every_number_of_the_readmes_experiments_table_is_in_results_md():
  readme, results = _read("README.md"), _read("docs", "results.md")
  assert len(table(readme, "## Experiments")) >= 10
  assert missing(readme, results) == []


def test_a_number_planted_in_the_readme_is_caught():
  readme, results = _read("README.md"), _read("docs", "results.md")
  planted = readme.replace("(+37.1) in 82 s", "(+37.1) in 83 s", 1)
  assert planted != readme
  assert missing(planted, results) == ["`default.py`: the README's measured 83 is not in its docs/results.md row"]
  planted = readme.replace("2-layer, d=64", "2-layer, d=4321", 1)
  assert missing(planted, results) == ["`default.py`: the README's 4321 (what it does) is nowhere in docs/results.md"]


def test_numbers_are_read_by_value_outside_names_and_code():
  assert numbers("7.0% → 63.0% (+56), 1,004 tests, 2.16× in 15–16 min, p = 0.007") == {
      7.0, 63.0, 56.0, 1004.0, 2.16, 15.0, 16.0, 0.007}
  assert numbers("Qwen2.5-0.5B r64 `gsm8k.py:1.5b` [x](docs/a2.md) 2026-11-23") == {0.5}
