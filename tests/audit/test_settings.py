"""How the audit is turned on: sdp-run's flags and the SDP_AUDIT variables."""

from __future__ import annotations

import pytest
from sdp_runtime import _audit
from sdp_runtime.launch import build_parser


@pytest.mark.parametrize(("argv", "mode", "script_args"), [
    (["t.py"], None, []),
    (["--audit", "t.py"], "on", []),
    (["--audit=strict", "-n", "2", "t.py"], "strict", []),
    (["--audit", "t.py", "--audit=strict"], "on", ["--audit=strict"]),  # the script's own
])
def test_audit_flags(argv: list[str], mode: str | None, script_args: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.audit == mode
    assert args.script == "t.py" and args.script_args == script_args


def test_audit_report_flag() -> None:
    args = build_parser().parse_args(["--audit-report", "a.json", "t.py"])
    assert args.audit_report == "a.json" and args.audit is None


def test_bad_audit_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--audit=loud", "t.py"])
    assert stop.value.code == 2
    assert "--audit" in capsys.readouterr().err


def test_settings_from_the_environment() -> None:
    assert _audit.settings({}).mode == "off"
    assert _audit.settings({"SDP_AUDIT": "0"}).mode == "off"
    assert _audit.settings({"SDP_AUDIT": "1"}).mode == "on"
    conf = _audit.settings({"SDP_AUDIT": "strict", "SDP_AUDIT_STEPS": "3",
                            "SDP_AUDIT_EVERY": "50", "SDP_AUDIT_REPORT": "r.json"})
    assert (conf.mode, conf.steps, conf.every, conf.report) == ("strict", 3, 50, "r.json")
    with pytest.raises(ValueError, match="SDP_AUDIT='loud'"):
        _audit.settings({"SDP_AUDIT": "loud"})


def test_off_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SDP_AUDIT", raising=False)
    assert _audit.install() is None and not _audit.active()
