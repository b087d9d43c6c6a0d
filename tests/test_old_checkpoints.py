"""Checkpoints written by slim_fairseq 0.1.0 load with today's code and give the outputs they
gave then (tests/fixtures/checkpoints_0_1_0; slim_fairseq/checkpoint_upgrade.py)."""
import os

import pytest
import torch

from helpers import REPO, load_plugin

FIXTURES = os.path.join(REPO, "tests", "fixtures", "checkpoints_0_1_0")
NAMES = sorted(name for name in os.listdir(FIXTURES)
               if os.path.isdir(os.path.join(FIXTURES, name)))


def test_every_family_has_a_fixture():
    assert {"stlm_tied", "stlm_lora_untied", "skipless_serial", "skipless_mistral",
            "skipless_parallel_noqp", "anthe_lm", "slim_lm_tying", "anthe_base",
            "subformer_base", "slim_transformer_tying"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_of_0_1_0_loads_and_gives_its_outputs(name):
    load_plugin()
    from fairseq import checkpoint_utils

    folder = os.path.join(FIXTURES, name)
    expected = torch.load(os.path.join(folder, "expected.pt"), weights_only=True)
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [os.path.join(folder, "checkpoint.pt")], arg_overrides={"data": folder})
    model = models[0].eval()
    inputs = expected["inputs"]
    with torch.no_grad():
        if "src_tokens" in inputs:
            out = model(inputs["src_tokens"], inputs["src_lengths"], inputs["prev_output_tokens"])
        else:
            out = model(inputs["prev_output_tokens"])
        logprobs = model.get_normalized_probs(out, log_probs=True)
    keep = inputs["prev_output_tokens"].ne(task.target_dictionary.pad())
    torch.testing.assert_close(logprobs[keep], expected["logprobs"][keep], atol=1e-5, rtol=1e-5)
    # the same model decodes step by step (its incremental state is the new layout's)
    if "src_tokens" not in inputs:
        state = {}
        prev = inputs["prev_output_tokens"][:1]
        with torch.no_grad():
            steps = [model.decoder(prev[:, : t + 1], incremental_state=state)[0]
                     for t in range(prev.size(1))]
            full = model.decoder(prev)[0]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)
