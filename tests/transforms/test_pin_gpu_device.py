from __future__ import annotations

from .helpers import check_noop, check_transformed, messages, run

ONLY = "pin_gpu_device"


def test_set_device_right_after_init():
    result = check_transformed(
        """\
        import torch

        model = torch.nn.Linear(2, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())

        model = torch.nn.Linear(2, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    assert messages(result, ONLY) == [
        "torch.cuda.set_device(sdp.local_rank()) when CUDA is available"
    ]
    assert [c.line for c in result.changes if c.transform == ONLY] == [1]


def test_cuda_index_strings_become_the_local_rank():
    result = check_transformed(
        """\
        import torch

        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        x = torch.ones(2).to('cuda:0')
        model = torch.nn.Linear(2, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())

        device = torch.device(f"cuda:{sdp.local_rank()}" if torch.cuda.is_available() else "cpu")
        x = torch.ones(2).to(f'cuda:{sdp.local_rank()}')
        model = torch.nn.Linear(2, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    changes = [(c.line, c.col, c.message) for c in result.changes if c.transform == ONLY]
    assert changes == [
        (1, 1, "torch.cuda.set_device(sdp.local_rank()) when CUDA is available"),
        (3, 23, '"cuda:0" -> f"cuda:{sdp.local_rank()}"'),
        (4, 22, "'cuda:0' -> f'cuda:{sdp.local_rank()}'"),
    ]


def test_a_device_string_variable_map_location_and_argparse_default():
    check_transformed(
        """\
        import argparse
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--device", default="cuda:0")
        args = parser.parse_args()
        dev = "cuda:0"
        state = torch.load("init.pt", map_location="cuda:0")
        model = torch.nn.Linear(2, 1).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, device=args.device)).sum().backward()
        opt.step()
        """,
        """\
        import argparse
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())

        parser = argparse.ArgumentParser()
        parser.add_argument("--device", default=f"cuda:{sdp.local_rank()}")
        args = parser.parse_args()
        dev = f"cuda:{sdp.local_rank()}"
        state = torch.load("init.pt", map_location=f"cuda:{sdp.local_rank()}")
        model = torch.nn.Linear(2, 1).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, device=args.device)).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )


def test_torch_device_with_an_index():
    check_transformed(
        """\
        import torch

        a = torch.device("cuda", 0)
        b = torch.device("cuda", index=0)
        c = torch.device(type="cuda", index=0)
        d = torch.device(0)
        model = torch.nn.Linear(2, 1).to(a)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())

        a = torch.device("cuda", sdp.local_rank())
        b = torch.device("cuda", index=sdp.local_rank())
        c = torch.device(type="cuda", index=sdp.local_rank())
        d = torch.device(sdp.local_rank())
        model = torch.nn.Linear(2, 1).to(a)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )


def test_integer_gpu_indices_and_the_script_s_own_set_device():
    result = check_transformed(
        """\
        import torch

        torch.cuda.set_device(0)
        model = torch.nn.Linear(2, 1).cuda(0)
        x = torch.ones(2).to(0)
        y = torch.zeros(2, device=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x + y).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        torch.cuda.set_device(sdp.local_rank())
        model = torch.nn.Linear(2, 1).cuda(sdp.local_rank())
        x = torch.ones(2).to(sdp.local_rank())
        y = torch.zeros(2, device=sdp.local_rank())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x + y).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    # no second set_device: the script's own one now pins the local rank's GPU
    assert messages(result, ONLY) == ["GPU 0 -> sdp.local_rank()"] * 4
    assert [c.line for c in result.changes if c.transform == ONLY] == [3, 4, 5, 6]


def test_an_integer_variable_used_as_the_gpu():
    check_transformed(
        """\
        import torch

        gpu = 0
        model = torch.nn.Linear(2, 1).cuda(gpu)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())

        gpu = sdp.local_rank()
        model = torch.nn.Linear(2, 1).cuda(gpu)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )


def test_cuda_without_an_index_is_left_alone():
    result = check_transformed(
        """\
        import torch

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = torch.nn.Linear(2, 1).cuda()
        x = torch.ones(2, device="cuda").to("cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = torch.nn.Linear(2, 1).cuda()
        x = torch.ones(2, device="cuda").to("cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    assert messages(result, ONLY) == [
        "torch.cuda.set_device(sdp.local_rank()) when CUDA is available"
    ]


def test_import_aliases():
    check_transformed(
        """\
        import torch as T
        from torch import device as dev
        from torch.cuda import set_device

        set_device(1)
        d = dev("cuda:1")
        model = T.nn.Linear(2, 1).to(d)
        opt = T.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch as T
        from torch import device as dev
        from torch.cuda import set_device
        import sdp_runtime.torch as sdp

        sdp.init()

        set_device(sdp.local_rank())
        d = dev(f"cuda:{sdp.local_rank()}")
        model = T.nn.Linear(2, 1).to(d)
        opt = T.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )


def test_torch_is_imported_when_the_file_has_no_torch_name():
    check_transformed(
        """\
        from torch import nn, optim

        model = nn.Linear(2, 1)
        opt = optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        from torch import nn, optim
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())

        model = nn.Linear(2, 1)
        opt = optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )


def test_set_device_follows_an_existing_init_in_main():
    check_transformed(
        """\
        import torch
        import sdp_runtime.torch as sdp


        def main():
            sdp.init()
            model = torch.nn.Linear(2, 1).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model(x).sum().backward()
            opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp


        def main():
            sdp.init()
            if torch.cuda.is_available():
                torch.cuda.set_device(sdp.local_rank())
            model = torch.nn.Linear(2, 1).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model(x).sum().backward()
            opt.step()
        """,
        only=ONLY,
    )


def test_an_already_pinned_script_is_left_alone():
    check_noop(
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())
            device = torch.device("cuda", sdp.local_rank())
        x = torch.ones(2).to(f"cuda:{sdp.local_rank()}").cuda(sdp.local_rank())
        model = torch.nn.Linear(2, 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )


def test_converting_the_output_again_changes_nothing():
    result = check_transformed(
        """\
        import torch
        torch.cuda.set_device(0)
        model = torch.nn.Linear(2, 1).to("cuda:0")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        torch.cuda.set_device(sdp.local_rank())
        model = torch.nn.Linear(2, 1).to(f"cuda:{sdp.local_rank()}")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    check_noop(result.output.decode(), only=ONLY)


def test_cuda_visible_devices_set_by_the_script_needs_a_person():
    result = check_transformed(
        """\
        import os
        import torch

        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
        print(os.environ.get("CUDA_VISIBLE_DEVICES"))
        model = torch.nn.Linear(2, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        import os
        import torch

        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")

        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())
        print(os.environ.get("CUDA_VISIBLE_DEVICES"))
        model = torch.nn.Linear(2, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    manual = [(c.line, c.message) for c in result.manual if c.transform == ONLY]
    note = (
        "CUDA_VISIBLE_DEVICES set by the script: every process would see the same GPUs; remove "
        "it (each process picks its GPU by local rank)"
    )
    assert manual == [(4, note), (5, note)]


def test_several_gpus_in_one_process_are_not_rewritten():
    result = check_transformed(
        """\
        import torch

        encoder = torch.nn.Linear(2, 2).to("cuda:0")
        decoder = torch.nn.Linear(2, 1).to("cuda:1")
        opt = torch.optim.SGD([*encoder.parameters(), *decoder.parameters()], lr=0.1)
        decoder(encoder(x).to("cuda:1")).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())

        encoder = torch.nn.Linear(2, 2).to("cuda:0")
        decoder = torch.nn.Linear(2, 1).to("cuda:1")
        opt = torch.optim.SGD([*encoder.parameters(), *decoder.parameters()], lr=0.1)
        decoder(encoder(x).to("cuda:1")).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    assert [(c.line, c.message) for c in result.manual if c.transform == ONLY] == [
        (3, "one process uses several GPUs (cuda:0, cuda:1): model parallelism is not "
            "converted; give each process its own GPUs by hand"),
    ]


def test_a_gpu_index_from_the_command_line_needs_a_person():
    result = check_transformed(
        """\
        import torch

        torch.cuda.set_device(args.gpu)
        model = torch.nn.Linear(2, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(sdp.local_rank())

        torch.cuda.set_device(args.gpu)
        model = torch.nn.Linear(2, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        only=ONLY,
    )
    assert [(c.line, c.col, c.message) for c in result.manual] == [
        (3, 23, "GPU index args.gpu chosen by the script: each process must use its own GPU, "
                "sdp.local_rank()"),
    ]


def test_minus_one_for_the_cpu_is_no_gpu_index_to_note():
    result = run(
        """\
        import torch

        def main(use_gpu):
            gpu = 0 if use_gpu else -1
            device = torch.device("cuda", gpu) if gpu >= 0 else torch.device("cpu")
            model = torch.nn.Linear(4, 1).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                opt.zero_grad()
                model(x.to(device)).sum().backward()
                opt.step()
        """,
        "pin_gpu_device",
    )
    assert "    gpu = sdp.local_rank() if use_gpu else -1\n" in result.output.decode()
    assert not messages(result, "pin_gpu_device", manual=True)
