"""The custom-loss notebook runs from top to bottom (its cells assert their own checks)."""
from __future__ import annotations

import os

import nbformat
from nbclient import NotebookClient

from tests.train.conftest import ROOT


def test_custom_loss_notebook_executes():
  path = os.path.join(ROOT, "notebooks", "custom_loss.ipynb")
  nb = nbformat.read(path, as_version=4)
  client = NotebookClient(nb, timeout=300, kernel_name="python3",
                          resources={"metadata": {"path": os.path.dirname(path)}})
  client.execute()
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "PPO keeps" in text and "[done]" in text
