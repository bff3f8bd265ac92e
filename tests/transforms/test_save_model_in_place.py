"""save_model_in_place: a checkpoint in the training loop saves CPU copies of the wrapped model's
weights instead of moving the model off its device and back (fast-neural-style's shape)."""

from __future__ import annotations

from .helpers import messages, run

ONLY = "save_model_in_place"
HEAD = """\
import os

import torch

device = torch.device("cuda")
transformer = torch.nn.Linear(4, 1).to(device)
optimizer = torch.optim.Adam(transformer.parameters(), 0.1)
for e in range(2):
    for batch_id, (x, y) in enumerate(torch.utils.data.DataLoader(data)):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(transformer(x.to(device)), y.to(device)).backward()
        optimizer.step()
        if batch_id % 100 == 0:
"""
FINAL = """\
transformer.eval().cpu()
torch.save(transformer.state_dict(), "final.pth")
"""


def _convert(checkpoint: str, **options: object) -> tuple[str, list[str], list[str]]:
    body = "".join(" " * 12 + line + "\n" for line in checkpoint.splitlines())
    result = run(HEAD + body + FINAL, None, **options)
    return (result.output.decode(), messages(result, ONLY),
            messages(result, "wrap_model_ddp", manual=True))


def test_the_checkpoint_round_trip_is_repaired():
    out, done, notes = _convert(
        'transformer.eval().cpu()\n'
        'name = "ckpt_" + str(e) + "_" + str(batch_id) + ".pth"\n'
        'torch.save(transformer.state_dict(), os.path.join(out_dir, name))\n'
        'transformer.to(device).train()\n'
    )
    assert "transformer = sdp.DistributedDataParallel(transformer)" in out
    loop = out[out.index("if batch_id % 100 == 0:"):out.index("transformer.eval().cpu()\n")]
    assert ".cpu()\n" not in loop and ".to(device).train()" not in loop, loop
    assert "{k: v.cpu() for k, v in transformer.state_dict().items()}" in loop, loop
    assert loop.rstrip().endswith("transformer.train()"), loop
    # The final save, after training has ended, is left as it was.
    assert 'transformer.eval().cpu()\nif sdp.rank() == 0:\n    torch.save(transformer.' \
           'state_dict(), "final.pth")' in out, out
    assert notes == []
    assert len(done) == 1 and done[0].startswith(
        "transformer.eval().cpu() and transformer.to(device).train() dropped: transformer stays "
        "on its device"), done


def test_eval_left_by_the_pair_is_kept_and_a_plain_move_needs_no_mode():
    out, done, notes = _convert(
        'transformer.cpu().eval()\ntorch.save(transformer.state_dict(), "c.pth")\n'
        "transformer.cuda()\n"
    )
    assert done and notes == []
    assert 'transformer.state_dict().items()}, "c.pth")\n' in out
    assert "            transformer.eval()\n" in out and "transformer.cuda()" not in out, out
    out, done, notes = _convert(
        'transformer.to("cpu")\ntorch.save(transformer.state_dict(), "c.pth")\n'
        "transformer.to(device)\n"
    )
    assert done and notes == [] and "transformer.to(" not in out.split("final")[0], out


def test_refused_shapes_keep_the_note():
    for checkpoint in (
        # a forward pass between the moves
        'transformer.eval().cpu()\nprint(transformer(torch.zeros(1, 4)))\n'
        'torch.save(transformer.state_dict(), "c.pth")\ntransformer.to(device).train()\n',
        # a function of the file, which could run the model
        'transformer.eval().cpu()\nevaluate()\n'
        'torch.save(transformer.state_dict(), "c.pth")\ntransformer.to(device).train()\n',
        # the state dict kept in a name (it could be changed before it is saved)
        'transformer.eval().cpu()\nstate = transformer.state_dict()\ntorch.save(state, "c.pth")\n'
        'transformer.to(device).train()\n',
        # a way out of the loop between the moves
        'transformer.eval().cpu()\ntorch.save(transformer.state_dict(), "c.pth")\n'
        'if done:\n    break\ntransformer.to(device).train()\n',
        # no move back in the same block
        'transformer.eval().cpu()\ntorch.save(transformer.state_dict(), "c.pth")\n',
        # a cast on the way back
        'transformer.cpu()\ntorch.save(transformer.state_dict(), "c.pth")\n'
        'transformer.to(torch.float16)\n',
    ):
        out, done, notes = _convert(checkpoint)
        assert done == [], checkpoint
        assert len(notes) == 1 and " moves the parameters of transformer" in notes[0], checkpoint
        assert "v.cpu() for k, v" not in out, checkpoint


def test_skipped_it_leaves_the_note():
    out, done, notes = _convert(
        'transformer.eval().cpu()\ntorch.save(transformer.state_dict(), "c.pth")\n'
        "transformer.to(device).train()\n", skip=frozenset({ONLY}))
    assert done == [] and len(notes) == 1 and "transformer.to(device).train()" in out
