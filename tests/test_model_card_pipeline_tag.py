"""The model card's pipeline tag of each pre-training export, from the config.json its exporter writes: a folder that
fills a mask says fill-mask; ELECTRA's discriminator, a replaced/original classifier per token, says none."""
import json

import pytest
from conftest import small_model_config

pytest.importorskip("transformers")

from bert_jax.hf import albert as hf_albert, bert as hf_bert, electra as hf_electra  # noqa: E402
from bert_jax.train import model_card  # noqa: E402

ELECTRA = dict(family="electra", embedding_size=16, generator_size_ratio=0.25, hidden_act="gelu", pad_token_id=0)
ALBERT = dict(family="albert", embedding_size=16, num_hidden_groups=1, hidden_act="gelu_new")
EXPORTS = {  # what each exporter writes as config.json -> the tag the card must give
    "bert": (lambda: hf_bert.hf_config(small_model_config()), "fill-mask"),
    "albert": (lambda: hf_albert.hf_config(small_model_config(**ALBERT)), "fill-mask"),
    "electra discriminator": (lambda: hf_electra.hf_config(small_model_config(**ELECTRA)), None),
    "electra generator/": (lambda: hf_electra.hf_config(small_model_config(**ELECTRA), generator=True), "fill-mask"),
}


@pytest.mark.parametrize("export", EXPORTS)
def test_the_card_tags_only_a_folder_that_fills_a_mask_as_fill_mask(export, tmp_path):
    hf_config, tag = EXPORTS[export]
    (tmp_path / "config.json").write_text(json.dumps(hf_config()))
    assert model_card._library_and_pipeline(str(tmp_path)) == ("transformers", tag)
