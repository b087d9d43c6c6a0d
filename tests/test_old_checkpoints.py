"""Checkpoints written by earlier versions load with today's code and give the outputs they gave
then: 0.1.0 (three LM classes; slim_fairseq/checkpoint_upgrade.py) and 0.2.0 (the previous
implementation of the attention, H-SoftPOS, RoPE, RMSNorm and the Tensor-Chain layers), under
tests/fixtures/checkpoints_<version>/, written by tests/fixtures/make_checkpoints.py."""
import os

import pytest
import torch

from helpers import REPO, load_plugin

FIXTURES = os.path.join(REPO, "tests", "fixtures")
VERSIONS = ("0_1_0", "0_2_0")
CASES = sorted((version, name) for version in VERSIONS
               for name in os.listdir(os.path.join(FIXTURES, f"checkpoints_{version}"))
               if os.path.isdir(os.path.join(FIXTURES, f"checkpoints_{version}", name)))


def test_every_family_has_a_fixture():
    names = {version: {name for v, name in CASES if v == version} for version in VERSIONS}
    assert {"stlm_tied", "stlm_lora_untied", "skipless_serial", "skipless_mistral",
            "skipless_parallel_noqp", "anthe_lm", "slim_lm_tying", "anthe_base",
            "subformer_base", "slim_transformer_tying"} <= names["0_1_0"]
    assert {"stlm_tied", "stlm_lora_tied_proj", "slim_lm_gqa_gates", "slim_lm_subformer",
            "skipless_serial", "skipless_mistral", "skipless_parallel_noqp", "anthe_lm",
            "anthe_base", "anthe_base_nopatt", "subformer_base", "slim_transformer_tying",
            "slim_transformer_block"} <= names["0_2_0"]


@pytest.mark.parametrize("version, name", CASES)
def test_checkpoint_of_an_earlier_version_loads_and_gives_its_outputs(version, name):
    load_plugin()
    from fairseq import checkpoint_utils

    folder = os.path.join(FIXTURES, f"checkpoints_{version}", name)
    expected = torch.load(os.path.join(folder, "expected.pt"), weights_only=True)
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [os.path.join(folder, "checkpoint.pt")], arg_overrides={"data": folder})
    model = models[0].eval()
    inputs = expected["inputs"]
    translation = "src_tokens" in inputs
    with torch.no_grad():
        if translation:
            out = model(inputs["src_tokens"], inputs["src_lengths"], inputs["prev_output_tokens"])
        else:
            out = model(inputs["prev_output_tokens"])
        logprobs = model.get_normalized_probs(out, log_probs=True)
    keep = inputs["prev_output_tokens"].ne(task.target_dictionary.pad())
    torch.testing.assert_close(logprobs[keep], expected["logprobs"][keep], atol=1e-5, rtol=1e-5)
    # the same model decodes step by step (its incremental state is today's layout)
    prev = inputs["prev_output_tokens"][:1]
    extra = {}
    with torch.no_grad():
        if translation:
            extra["encoder_out"] = model.encoder(inputs["src_tokens"][:1],
                                                 src_lengths=inputs["src_lengths"][:1])
        state = {}
        steps = [model.decoder(prev[:, : t + 1], incremental_state=state, **extra)[0]
                 for t in range(prev.size(1))]
        full = model.decoder(prev, **extra)[0]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)
