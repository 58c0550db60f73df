"""The committed splitleak.v1 stubs match what the pinned generators produce, and import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GEN_PROTOS = REPO / "scripts" / "gen_protos.py"


def run_gen_protos(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GEN_PROTOS), *args], cwd=REPO, capture_output=True, text=True
    )


def test_regeneration_matches_committed_stubs() -> None:
    run = run_gen_protos("--check")
    assert run.returncode == 0, f"stale stubs; run python scripts/gen_protos.py\n{run.stdout}"
    assert run.stdout == ""


def test_regeneration_into_another_folder_writes_identical_bytes(tmp_path: Path) -> None:
    run = run_gen_protos("--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    written = sorted(p.name for p in (tmp_path / "splitleak" / "v1").iterdir())
    assert "__init__.py" in written and "split_learning_pb2_grpc.pyi" in written
    for name in written:
        generated = (tmp_path / "splitleak" / "v1" / name).read_bytes()
        assert generated == (REPO / "splitleak" / "v1" / name).read_bytes(), name


def test_check_reports_a_diff_for_an_edited_stub(tmp_path: Path) -> None:
    assert run_gen_protos("--out", str(tmp_path)).returncode == 0
    stub = tmp_path / "splitleak" / "v1" / "tensor_pb2.py"
    stub.write_text(stub.read_text() + "# hand edit\n")
    run = run_gen_protos("--check", "--out", str(tmp_path))
    assert run.returncode == 1
    assert "--- a/splitleak/v1/tensor_pb2.py" in run.stdout
    assert "-# hand edit" in run.stdout


def test_label_party_service_has_join_and_train() -> None:
    from splitleak.v1 import split_learning_pb2, split_learning_pb2_grpc, tensor_pb2

    service = split_learning_pb2.DESCRIPTOR.services_by_name["LabelParty"]
    assert service.full_name == "splitleak.v1.LabelParty"
    join, train = service.methods_by_name["Join"], service.methods_by_name["Train"]
    assert join.input_type.name == "JoinRequest" and join.output_type.name == "TrainingPlan"
    assert not join.client_streaming and not join.server_streaming
    assert train.client_streaming and train.server_streaming
    assert callable(split_learning_pb2_grpc.LabelPartyServicer.Join)
    assert callable(split_learning_pb2_grpc.LabelPartyServicer.Train)
    assert callable(split_learning_pb2_grpc.add_LabelPartyServicer_to_server)
    message = split_learning_pb2.PartyMessage(activation=tensor_pb2.Tensor(shape=[2, 3]))
    assert split_learning_pb2.PartyMessage.FromString(message.SerializeToString()) == message
