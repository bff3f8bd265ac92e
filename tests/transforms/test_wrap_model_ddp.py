from __future__ import annotations

from .helpers import check_noop, check_transformed, messages, run

ONLY = "wrap_model_ddp"


def changes(result, manual: bool | None = None) -> list[tuple[int, str]]:
    return [
        (c.line, c.message)
        for c in result.changes
        if c.transform == ONLY and (manual is None or c.manual == manual)
    ]


def test_module_level_model_is_wrapped_right_after_it_is_moved():
    result = check_transformed(
        """\
        import torch
        import torch.nn as nn

        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        criterion = nn.CrossEntropyLoss()
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        torch.save(model.state_dict(), "model.pt")
        """,
        """\
        import torch
        import torch.nn as nn
        import sdp_runtime.torch as sdp

        sdp.init()

        model = Net().to(device)
        model = sdp.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        criterion = nn.CrossEntropyLoss()
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        torch.save(model.state_dict(), "model.pt")
        """,
        only=ONLY,
    )
    assert changes(result) == [(4, "wrap model in sdp.DistributedDataParallel")]


def test_moved_under_a_condition_the_wrap_follows_the_if():
    check_transformed(
        """\
        import torch.optim as optim


        def main():
            model = Net()
            if use_cuda:
                model.cuda()
            optimizer = optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(3):
                train(model, optimizer)


        def train(model, optimizer):
            model(x).sum().backward()
            optimizer.step()

        if __name__ == "__main__":
            main()
        """,
        """\
        import torch.optim as optim
        import sdp_runtime.torch as sdp

        sdp.init()


        def main():
            model = Net()
            if use_cuda:
                model.cuda()
            model = sdp.DistributedDataParallel(model)
            optimizer = optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(3):
                train(model, optimizer)


        def train(model, optimizer):
            model(x).sum().backward()
            optimizer.step()

        if __name__ == "__main__":
            main()
        """,
        only=ONLY,
    )


def test_moved_and_frozen_after_the_optimizer_is_built():
    result = check_transformed(
        """\
        from torch.optim import SGD

        model = Net()
        opt = SGD(model.parameters(), lr=0.1)
        print(model)
        model.to(device)
        for p in model.backbone.parameters():
            p.requires_grad = False
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """,
        """\
        from torch.optim import SGD
        import sdp_runtime.torch as sdp

        sdp.init()

        model = Net()
        opt = SGD(model.parameters(), lr=0.1)
        print(model)
        model.to(device)
        for p in model.backbone.parameters():
            p.requires_grad = False
        model = sdp.DistributedDataParallel(model)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """,
        only=ONLY,
    )
    assert changes(result) == [(7, "wrap model in sdp.DistributedDataParallel")]


def test_a_model_attribute_of_a_trainer_class():
    result = check_transformed(
        """\
        import torch


        class Trainer:
            def __init__(self, cfg):
                self.model = WaveNet().to(self.device)
                self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)

            def train_epoch(self):
                for x in self.loader:
                    self.model(x).sum().backward()
                    self.optimizer.step()

        if __name__ == "__main__":
            main()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()


        class Trainer:
            def __init__(self, cfg):
                self.model = WaveNet().to(self.device)
                self.model = sdp.DistributedDataParallel(self.model)
                self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)

            def train_epoch(self):
                for x in self.loader:
                    self.model(x).sum().backward()
                    self.optimizer.step()

        if __name__ == "__main__":
            main()
        """,
        only=ONLY,
    )
    assert changes(result) == [(6, "wrap self.model in sdp.DistributedDataParallel")]


def test_model_and_optimizer_from_factories():
    check_transformed(
        """\
        import torch


        def build_model(arch):
            model = torch.nn.Sequential(torch.nn.Linear(4, 4))
            return model


        def build_optimizer(params, lr):
            return torch.optim.RMSprop(params, lr=lr)


        if __name__ == "__main__":
            model = build_model("small").to(device)
            optimizer = build_optimizer(model.parameters(), 0.1)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()


        def build_model(arch):
            model = torch.nn.Sequential(torch.nn.Linear(4, 4))
            return model


        def build_optimizer(params, lr):
            return torch.optim.RMSprop(params, lr=lr)


        if __name__ == "__main__":
            model = build_model("small").to(device)
            model = sdp.DistributedDataParallel(model)
            optimizer = build_optimizer(model.parameters(), 0.1)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """,
        only=ONLY,
    )


def test_model_passed_to_the_function_that_trains_it():
    result = check_transformed(
        """\
        import torch


        def train(net, loader):
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for x in loader:
                loss = net.encode(x).sum() + net(x).sum()
                loss.backward()
                opt.step()
            print(net.num_classes, net.head.weight.norm())


        def main():
            model = Net().cuda()
            train(model, loader)

        if __name__ == "__main__":
            main()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()


        def train(net, loader):
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for x in loader:
                loss = net.encode(x).sum() + net(x).sum()
                loss.backward()
                opt.step()
            print(net.num_classes, net.head.weight.norm())


        def main():
            model = Net().cuda()
            model = sdp.DistributedDataParallel(model)
            train(model, loader)

        if __name__ == "__main__":
            main()
        """,
        only=ONLY,
    )
    # attributes reach the wrapped module through sdp.DistributedDataParallel; a method call
    # in the training step bypasses DDP's forward, so it needs a person
    assert changes(result) == [
        (7, "net.encode(...) runs the wrapped module around DDP's forward: gradients computed "
            "through it are not averaged; in the training step call net(...) instead"),
        (14, "wrap model in sdp.DistributedDataParallel"),
    ]
    assert [c.line for c in result.manual] == [7]


def test_submodule_attributes_are_left_as_they_are():
    result = check_transformed(
        """\
        import torch

        model = Classifier().to(device)
        optimizer = torch.optim.SGD(
            [{"params": model.backbone.parameters()}, {"params": model.head.parameters()}], lr=0.1
        )
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
        print(model.num_classes)
        model.eval()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        model = Classifier().to(device)
        model = sdp.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(
            [{"params": model.backbone.parameters()}, {"params": model.head.parameters()}], lr=0.1
        )
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
        print(model.num_classes)
        model.eval()
        """,
        only=ONLY,
    )
    assert result.manual == []


def test_two_models_with_two_optimizers_are_both_wrapped():
    result = check_transformed(
        """\
        import torch

        netG = Generator().to(device)
        netD = Discriminator().to(device)
        optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
        optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
        for z, real in loader:
            errD = netD(real).mean() - netD(netG(z).detach()).mean()
            errD.backward()
            optD.step()
            errG = -netD(netG(z)).mean()
            errG.backward()
            optG.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        netG = Generator().to(device)
        netG = sdp.DistributedDataParallel(netG)
        netD = Discriminator().to(device)
        netD = sdp.DistributedDataParallel(netD)
        optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
        optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
        for z, real in loader:
            errD = netD(real).mean() - netD(netG(z).detach()).mean()
            errD.backward()
            optD.step()
            errG = -netD(netG(z)).mean()
            errG.backward()
            optG.step()
        """,
        only=ONLY,
    )
    assert messages(result, ONLY) == [
        "wrap netG in sdp.DistributedDataParallel",
        "wrap netD in sdp.DistributedDataParallel",
    ]


def test_data_parallel_is_replaced_by_the_ddp_wrap():
    result = check_transformed(
        """\
        import torch
        import torch.nn as nn

        model = Net()
        if torch.cuda.device_count() > 1:
            model = nn.DataParallel(model, device_ids=[0, 1])
        model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """,
        """\
        import torch
        import torch.nn as nn
        import sdp_runtime.torch as sdp

        sdp.init()

        model = Net()
        model.to(device)
        model = sdp.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """,
        only=ONLY,
    )
    assert changes(result) == [
        (6, "nn.DataParallel removed: one process per GPU, the model is wrapped in "
            "sdp.DistributedDataParallel instead"),
        (7, "wrap model in sdp.DistributedDataParallel"),
    ]


def test_data_parallel_inside_an_expression():
    check_transformed(
        """\
        import torch
        from torch.nn.parallel import DataParallel


        class Trainer:
            def __init__(self):
                self.model = DataParallel(WaveNet()).cuda()
                self.opt = torch.optim.Adam(self.model.parameters())

            def step(self, x):
                self.model(x).sum().backward()
                self.opt.step()

        if __name__ == "__main__":
            main()
        """,
        """\
        import torch
        from torch.nn.parallel import DataParallel
        import sdp_runtime.torch as sdp

        sdp.init()


        class Trainer:
            def __init__(self):
                self.model = WaveNet().cuda()
                self.model = sdp.DistributedDataParallel(self.model)
                self.opt = torch.optim.Adam(self.model.parameters())

            def step(self, x):
                self.model(x).sum().backward()
                self.opt.step()

        if __name__ == "__main__":
            main()
        """,
        only=ONLY,
    )


def test_the_wrap_comes_before_torch_compile():
    result = check_transformed(
        """\
        import torch

        model = Net().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model = torch.compile(model)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        model = Net().cuda()
        model = sdp.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model = torch.compile(model)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """,
        only=ONLY,
    )
    assert messages(result, ONLY) == [
        "wrap model in sdp.DistributedDataParallel (before torch.compile)"
    ]


def test_an_already_wrapped_model_is_left_alone():
    check_noop(
        """\
        import torch
        import sdp_runtime.torch as sdp
        from sdp_runtime.torch import DistributedDataParallel as DDP

        sdp.init()
        model = DDP(Net().cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        other = Net().cuda()
        other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
        other = sdp.DistributedDataParallel(other)
        for x in loader:
            (model(x) + other(x)).sum().backward()
            opt.step()
        """,
        only=ONLY,
    )


def test_converting_the_output_again_changes_nothing():
    result = check_transformed(
        """\
        import torch

        model = Net()
        model = torch.nn.DataParallel(model)
        model.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        model = Net()
        model.cuda()
        model = sdp.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            model(x).sum().backward()
            opt.step()
        """,
        only=ONLY,
    )
    check_noop(result.output.decode(), only=ONLY)


def test_a_model_no_optimizer_trains_gets_a_note():
    result = check_transformed(
        """\
        import torch
        import torch.nn as nn


        class Net(nn.Module):
            def forward(self, x):
                return x


        student = Net().cuda()
        teacher = Net().cuda()
        teacher.load_state_dict(torch.load("teacher.pt"))
        opt = torch.optim.SGD(student.parameters(), lr=0.1)
        for x in loader:
            loss = (student(x) - teacher(x)).pow(2).mean()
            loss.backward()
            opt.step()
        """,
        """\
        import torch
        import torch.nn as nn
        import sdp_runtime.torch as sdp

        sdp.init()


        class Net(nn.Module):
            def forward(self, x):
                return x


        student = Net().cuda()
        student = sdp.DistributedDataParallel(student)
        teacher = Net().cuda()
        teacher.load_state_dict(torch.load("teacher.pt"))
        opt = torch.optim.SGD(student.parameters(), lr=0.1)
        for x in loader:
            loss = (student(x) - teacher(x)).pow(2).mean()
            loss.backward()
            opt.step()
        """,
        only=ONLY,
    )
    assert changes(result, manual=True) == [
        (11, "teacher is not trained here (no optimizer gets its parameters): left unwrapped, "
             "each process runs its own copy"),
    ]


def test_a_model_inside_another_model_is_not_wrapped_on_its_own():
    result = check_transformed(
        """\
        import torch

        encoder = Encoder().cuda()
        decoder = Decoder(encoder).cuda()
        opt = torch.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()))
        for x in loader:
            decoder(x).sum().backward()
            opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        encoder = Encoder().cuda()
        decoder = Decoder(encoder).cuda()
        decoder = sdp.DistributedDataParallel(decoder)
        opt = torch.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()))
        for x in loader:
            decoder(x).sum().backward()
            opt.step()
        """,
        only=ONLY,
    )
    assert changes(result, manual=True) == [
        (3, "encoder is part of decoder, which is wrapped: not wrapped on its own"),
    ]


def test_an_optimizer_over_plain_tensors_needs_a_person():
    result = check_transformed(
        """\
        import torch

        w = torch.zeros(3, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        for x in loader:
            (x @ w).sum().backward()
            opt.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        w = torch.zeros(3, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        for x in loader:
            (x @ w).sum().backward()
            opt.step()
        """,
        only=ONLY,
    )
    assert changes(result, manual=True) == [
        (4, "could not tell which model this optimizer trains: wrap it in "
            "sdp.DistributedDataParallel by hand (or average the gradients with sdp.allreduce "
            "before each step)"),
    ]


def test_without_a_visible_optimizer_the_module_feeding_backward_is_the_model():
    check_transformed(
        """\
        import torch
        import torch.nn as nn
        from mylib import make_optimizer


        class Net(nn.Module):
            pass


        model = Net().cuda()
        crit = nn.MSELoss()
        opt = make_optimizer(cfg)
        for x, y in loader:
            out = model(x)
            loss = crit(out, y)
            loss.backward()
            opt.step()
        """,
        """\
        import torch
        import torch.nn as nn
        from mylib import make_optimizer
        import sdp_runtime.torch as sdp

        sdp.init()


        class Net(nn.Module):
            pass


        model = Net().cuda()
        model = sdp.DistributedDataParallel(model)
        crit = nn.MSELoss()
        opt = make_optimizer(cfg)
        for x, y in loader:
            out = model(x)
            loss = crit(out, y)
            loss.backward()
            opt.step()
        """,
        only=ONLY,
    )


def test_model_chosen_in_if_elif_else_is_wrapped_where_the_branches_join():
    """Issue 18 (word_language_model): only the last branch was wrapped, so the Transformer
    option trained with no gradient averaging."""
    result = check_transformed(
        """\
        import torch
        import torch.nn as nn

        if args.model == "Transformer":
            model = nn.Transformer(d_model=8, nhead=2).to(device)
        elif args.model == "GRU":
            model = nn.GRU(8, 8)
            model.to(device)
        else:
            model = nn.LSTM(8, 8).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        """,
        """\
        import torch
        import torch.nn as nn
        import sdp_runtime.torch as sdp

        sdp.init()

        if args.model == "Transformer":
            model = nn.Transformer(d_model=8, nhead=2).to(device)
        elif args.model == "GRU":
            model = nn.GRU(8, 8)
            model.to(device)
        else:
            model = nn.LSTM(8, 8).to(device)
        model = sdp.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        """,
        only=ONLY,
    )
    assert messages(result, ONLY, manual=True) == []


def test_model_replaced_on_resume_is_wrapped_after_the_if():
    check_transformed(
        """\
        import torch

        model = Net()
        if args.resume:
            model = torch.load(args.resume, weights_only=False)
        optimizer = torch.optim.Adam(model.parameters())
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        model = Net()
        if args.resume:
            model = torch.load(args.resume, weights_only=False)
        model = sdp.DistributedDataParallel(model)
        optimizer = torch.optim.Adam(model.parameters())
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        """,
        only=ONLY,
    )


def test_model_used_inside_its_branch_gets_a_note():
    result = check_transformed(
        """\
        import torch

        if big:
            model = Big()
            print(model(example))
        else:
            model = Small()
        optimizer = torch.optim.Adam(model.parameters())
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        if big:
            model = Big()
            print(model(example))
        else:
            model = Small()
            model = sdp.DistributedDataParallel(model)
        optimizer = torch.optim.Adam(model.parameters())
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        """,
        only=ONLY,
    )
    (note,) = messages(result, ONLY, manual=True)
    assert note.startswith("model is created in several branches and used inside one")


def test_a_model_made_and_trained_inside_one_branch_stays_there():
    check_transformed(
        """\
        import torch

        if train:
            model = Net()
            optimizer = torch.optim.Adam(model.parameters())
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        if train:
            model = Net()
            model = sdp.DistributedDataParallel(model)
            optimizer = torch.optim.Adam(model.parameters())
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
        """,
        only=ONLY,
    )


def test_a_model_whose_outputs_are_partly_discarded_looks_for_unused_parameters():
    result = run(
        """\
        import torch

        D = Discriminator()
        opt = torch.optim.SGD(D.parameters(), lr=0.1)
        for x in torch.utils.data.DataLoader(data):
            validity, _, _ = D(x)
            validity.mean().backward()
            opt.step()
        """,
        ONLY,
    )
    assert "D = sdp.DistributedDataParallel(D, find_unused_parameters=True)\n" in (
        result.output.decode()
    )
    plain = run(
        "import torch\n\nD = Net()\nopt = torch.optim.SGD(D.parameters(), lr=0.1)\n"
        "for x in torch.utils.data.DataLoader(data):\n"
        "    validity, logits = D(x)\n    (validity + logits).mean().backward()\n    opt.step()\n",
        ONLY,
    )
    assert "D = sdp.DistributedDataParallel(D)\n" in plain.output.decode()


# -- models that get no gradient, and weights set up after construction ---------------------------


def test_a_frozen_encoder_is_not_wrapped_and_the_report_says_why():
    result = check_transformed(
        """\
        import torch
        import torch.nn as nn

        encoder = Encoder()
        for p in encoder.parameters():
            p.requires_grad = False
        head = nn.Linear(16, 3)
        optimizer = torch.optim.SGD(list(encoder.parameters()) + list(head.parameters()), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(head(encoder(x)), y).backward()
            optimizer.step()
        """,
        """\
        import torch
        import torch.nn as nn
        import sdp_runtime.torch as sdp

        sdp.init()

        encoder = Encoder()
        for p in encoder.parameters():
            p.requires_grad = False
        sdp.broadcast_parameters(encoder.state_dict(), root_rank=0)
        head = nn.Linear(16, 3)
        head = sdp.DistributedDataParallel(head)
        optimizer = torch.optim.SGD(list(encoder.parameters()) + list(head.parameters()), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(head(encoder(x)), y).backward()
            optimizer.step()
        """,
        ONLY,
    )
    assert changes(result, manual=False)[0] == (
        5,
        "every parameter of encoder is frozen (requires_grad False): not wrapped in "
        "sdp.DistributedDataParallel (no gradient to average); "
        "sdp.broadcast_parameters(encoder.state_dict(), root_rank=0) instead",
    )


def test_a_feature_extractor_only_run_under_no_grad_is_not_wrapped():
    result = run(
        """\
        import torch
        import torch.nn as nn

        backbone = Backbone().eval()
        head = nn.Linear(16, 3)
        optimizer = torch.optim.Adam([*backbone.parameters(), *head.parameters()])
        for x, y in loader:
            with torch.no_grad():
                feats = backbone(x)
            optimizer.zero_grad()
            nn.functional.cross_entropy(head(feats), y).backward()
            optimizer.step()
        """,
        ONLY,
    )
    out = result.output.decode()
    assert "backbone = sdp.DistributedDataParallel" not in out
    # Its weights are rank 0's on every rank all the same (it may be randomly initialised).
    assert (
        "backbone = Backbone().eval()\n"
        "sdp.broadcast_parameters(backbone.state_dict(), root_rank=0)\n" in out
    )
    assert "head = sdp.DistributedDataParallel(head)" in out
    assert any("backbone only runs under torch.no_grad()" in m for m in messages(result, ONLY))


def test_the_wrap_comes_after_a_helper_that_initialises_the_weights_and_after_loading_them():
    check_transformed(
        """\
        import torch
        import torch.nn as nn


        def initialize_weights(model):
            for m in model.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.normal_(m.weight, 0.0, 0.02)


        model = Net()
        initialize_weights(model)
        model.apply(init_fn)
        model.load_state_dict(torch.load("pretrained.pt"))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        """,
        """\
        import torch
        import torch.nn as nn
        import sdp_runtime.torch as sdp

        sdp.init()


        def initialize_weights(model):
            for m in model.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.normal_(m.weight, 0.0, 0.02)


        model = Net()
        initialize_weights(model)
        model.apply(init_fn)
        model.load_state_dict(torch.load("pretrained.pt"))
        model = sdp.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        """,
        ONLY,
    )


def test_a_helper_that_trains_or_runs_the_model_still_ends_the_setup():
    result = run(
        """\
        import torch


        def warm_up(model):
            model(torch.ones(1, 2))


        model = Net()
        warm_up(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        """,
        ONLY,
    )
    out = result.output.decode()
    assert "model = Net()\nmodel = sdp.DistributedDataParallel(model)\nwarm_up(model)" in out


def test_outputs_thrown_away_in_evaluation_only_ask_for_no_unused_parameter_search():
    source = """\
        import torch

        def main():
            model = Net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                opt.zero_grad()
                out, aux, attn = model(x)
                (out + aux + attn).sum().backward()
                opt.step()
            with torch.no_grad():
                out, _, _ = model(probe)
        """
    result = run(source, "wrap_model_ddp")
    out = result.output.decode()
    assert "model = sdp.DistributedDataParallel(model)\n" in out
    assert "find_unused_parameters" not in out
    # Thrown away while training, it still asks for the search.
    training = source.replace("out, aux, attn = model(x)", "out, _, _ = model(x)").replace(
        "(out + aux + attn)", "out")
    assert "find_unused_parameters=True" in run(training, "wrap_model_ddp").output.decode()


def test_a_model_made_in_two_branches_and_used_in_one_names_the_branch_it_wraps():
    result = run(
        """\
        import torch

        def main(big):
            if big:
                model = torch.nn.Linear(8, 1)
                print(model(torch.randn(1, 8)))
            else:
                model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
        """,
        "wrap_model_ddp",
    )
    out = result.output.decode()
    assert ("        model = torch.nn.Linear(4, 1)\n"
            "        model = sdp.DistributedDataParallel(model)\n") in out
    [note] = messages(result, "wrap_model_ddp", manual=True)
    assert "wrapped only in the branch of `model = torch.nn.Linear(4, 1)`" in note


def test_the_wrap_goes_after_the_models_last_move_past_helpers_that_only_read_it():
    """sentiment-rnn notebook: ``count_parameters(model)`` (a helper of the file that only reads
    the model) was taken for the start of training, and the wrap went before
    ``model.apply(initialize_weights)``, the embedding copy and ``model = model.to(device)``."""
    result = run(
        """\
        import torch
        import torch.nn as nn


        def count_parameters(model):
            return sum(p.numel() for p in model.parameters() if p.requires_grad)


        def initialize_weights(m):
            if isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight)


        def train(loader, model, optimizer, device):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
                optimizer.step()


        model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))
        print(f"The model has {count_parameters(model):,} trainable parameters")
        model.apply(initialize_weights)
        model[0].weight.data = torch.randn(10, 4)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = model.to(device)
        loader = torch.utils.data.DataLoader(data)
        for epoch in range(3):
            train(loader, model, optimizer, device)
        """,
        ONLY,
    )
    out = result.output.decode()
    assert ("model = model.to(device)\nmodel = sdp.DistributedDataParallel(model)\n"
            "loader = ") in out, out
    assert out.count("DistributedDataParallel(") == 1


def test_a_checkpoint_that_moves_the_wrapped_model_to_the_cpu_mid_training_is_noted():
    """fast-neural-style: each checkpoint did ``transformer.eval().cpu()`` ... ``transformer.to(
    device).train()`` on the wrapped model, unnoted. A manual note at that line; none for the
    move after training has ended."""
    source = """\
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
                    transformer.eval().cpu()
                    torch.save(transformer.state_dict(), "ckpt.pth")
                    transformer.to(device).train()
        transformer.eval().cpu()
        torch.save(transformer.state_dict(), "final.pth")
        """
    result = run(source, ONLY)
    assert "transformer = sdp.DistributedDataParallel(transformer)" in result.output.decode()
    notes = changes(result, manual=True)
    assert [line for line, _ in notes] == [12], notes
    assert notes[0][1].startswith(
        "transformer.eval().cpu() moves the parameters of transformer, a "
        "sdp.DistributedDataParallel from here on, off its device")
    assert ("torch.save({k: v.cpu() for k, v in transformer.state_dict().items()}, path)"
            in notes[0][1])


def test_a_model_of_several_branches_wrapped_after_its_move_below_them_gets_no_branch_note():
    # srgan-tutorial / captioning-tutorial: the optimizer is made inside the first branch, the
    # checkpoint branch loads both; the wrap goes after `model = model.to(device)` below the
    # join, so every branch's model is wrapped and "wrapped only in the branch of" was false.
    result = check_transformed(
        """\
        import torch

        if checkpoint is None:
            model = Net()
            optimizer = torch.optim.Adam(model.parameters())
        else:
            model = checkpoint["model"]
            optimizer = checkpoint["optimizer"]
        model = model.to(device)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        """,
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        if checkpoint is None:
            model = Net()
            optimizer = torch.optim.Adam(model.parameters())
        else:
            model = checkpoint["model"]
            optimizer = checkpoint["optimizer"]
        model = model.to(device)
        model = sdp.DistributedDataParallel(model)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        """,
        only=ONLY,
    )
    assert messages(result, ONLY, manual=True) == []
