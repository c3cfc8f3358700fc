"""tests/conftest.py's LONGEST_FIRST names test files that exist (a renamed one would silently start last)."""
import os

from tests.conftest import LONGEST_FIRST, ROOT


def test_the_longest_files_named_first_exist_once_each():
  assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
  missing = [path for path in LONGEST_FIRST if not os.path.isfile(os.path.join(ROOT, path))]
  assert not missing, f"tests/conftest.py's LONGEST_FIRST names files that do not exist: {missing}"
