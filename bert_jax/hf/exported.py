"""What every family's `HfConverter.to_hf` returns: one value type, whether the family exports one model or a
main model with others beside it (ELECTRA's and DeBERTa-v3's generator, in `generator/`)."""
import dataclasses

import numpy as np

from bert_jax.hf import folder as hf_folder
from bert_jax.storage import paths


@dataclasses.dataclass(frozen=True)
class HfExport:
    state: dict[str, np.ndarray]  # the main folder's tensors, in Hugging Face's names
    config: dict  # its config.json
    # Folders beside the main one: {name: (state dict, config.json)}, written to OUT/name.
    subfolders: dict[str, tuple[dict[str, np.ndarray], dict]] = dataclasses.field(default_factory=dict)

    def write(self, out: str, tokenizer_dir: str | None, model_max_length: int | None = None) -> None:
        """The main folder at `out`, each subfolder under it, every one with the tokenizer's files."""
        hf_folder.write_hf_folder(out, self.state, self.config, tokenizer_dir, model_max_length=model_max_length)
        for name, (state, config) in self.subfolders.items():
            hf_folder.write_hf_folder(str(paths.path(out) / name), state, config, tokenizer_dir,
                                      model_max_length=model_max_length)
