""":class:`LLMPackage`: the one-file Circle model (prefill and decode entry points) plus its manifest.

Right after ``export_llm`` it holds the two :class:`~circle_fx.CircleModel` objects;
after ``LLMPackage.load(dir)`` it holds only file paths (nothing is re-exported).
``save(dir)`` writes ``model.circle`` (atomically; both entry points, each weight once), the text files
(``tokenizer.json``, ``chat_template.jinja``, ``generation_config.json``, ``config.json``: ``assets``) and then
``manifest.json`` last, so a directory with a manifest always has every file it names.
"""
from __future__ import annotations

import os
import shutil

from . import manifest as mf


class LLMPackage:
    def __init__(self, manifest: dict, decode=None, prefill=None, directory: str | None = None,
                 assets: dict[str, str] | None = None, model=None, legacy: dict | None = None):
        self.manifest = manifest
        self.decode = decode
        self.prefill = prefill
        #: the one-file model (``model.circle``: both entry points, weights once), after export_llm
        self.model = model
        self._legacy = legacy  # the version-1 manifest (save(layout="two"))
        self.directory = directory
        self.assets = dict(assets or {})  # file name -> text contents, written next to the models

    @classmethod
    def load(cls, directory) -> "LLMPackage":
        directory = os.fspath(directory)
        return cls(mf.read(directory), directory=directory)

    def save(self, directory, layout: str = "one") -> str:
        """Write the package. ``layout="one"`` (default): ``model.circle`` (both entry points,
        each weight once) + ``config.json``; ``"two"``: the version-1 layout (``prefill.circle`` +
        ``decode.circle``, each with every weight; two onert sessions), for comparisons."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        manifest = self.manifest
        if layout == "two":
            if self._legacy is None or self.prefill is None:
                raise ValueError("layout='two' needs the package as export_llm returned it")
            manifest = self._legacy
            for part, model in (("prefill", self.prefill), ("decode", self.decode)):
                model.save(os.path.join(directory, manifest[part]["file"]))
        elif layout != "one":
            raise ValueError(f"layout must be 'one' or 'two', got {layout!r}")
        elif self.model is not None:
            self.model.save(os.path.join(directory, manifest["file"]))
        else:
            for name in mf.model_files(manifest):
                if self.directory and os.path.abspath(self.directory) != os.path.abspath(directory):
                    shutil.copyfile(os.path.join(self.directory, name), os.path.join(directory, name))
        for name in mf.asset_files(manifest):
            dest = os.path.join(directory, name)
            if name in self.assets:
                _write_text(dest, self.assets[name])
            elif self.directory and os.path.abspath(self.directory) != os.path.abspath(directory):
                shutil.copyfile(os.path.join(self.directory, name), dest)
        mf.write(directory, manifest)
        if layout == "one":
            self.directory = self.directory or directory
        return directory

    def path(self, part: str = "model") -> str:
        """The file holding ``part`` ("prefill", "decode"; "model": the package's file)."""
        if self.directory is None:
            raise ValueError("the package has not been saved yet")
        m = self.manifest
        return os.path.join(self.directory, m["file"] if mf.one_file(m) else m[part]["file"])

    def read(self, part: str):
        """``part``'s subgraph of the saved package as a ``circle.reader.CircleFile``."""
        from ..circle.reader import read_circle

        return read_circle(self.path(part), self.manifest[part].get("subgraph", 0))

    def runner(self, directory: str | None = None, runtime=None):
        """An :class:`~circle_fx.llm.runner.LLMRunner` on this package (saved to a temp dir first if
        needed); ``runtime``: as ``LLMRunner``'s (e.g. :class:`circle_fx.circle.arm64.Arm64Runtime`)."""
        from .runner import LLMRunner

        if self.directory is None:
            import tempfile

            self.save(directory or tempfile.mkdtemp(prefix="circle_fx_llm_"))
        return LLMRunner(self.directory, runtime=runtime)

    def __repr__(self) -> str:
        m = self.manifest
        return (f"<LLMPackage {m['model']['architecture']} layers={m['model']['num_layers']} "
                f"max_seq_len={m['max_seq_len']} prefill_len={m['prefill_len']}>")


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
