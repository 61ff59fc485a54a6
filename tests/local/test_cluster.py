"""The real node's pieces that run without starting it: the machine check names what is missing, and the image
list that hack/build-images.sh hands to the cluster. (The node itself: e2e/test_real_node.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.paths import REPO

from disagg.local.cluster import image_archives

NODE_TOOLS = REPO / "hack" / "ensure-node-tools.sh"
# what the script itself runs (not what it checks for)
SHELL_TOOLS = ("bash", "grep", "sort", "tr", "id", "cat", "printf", "echo")


def _path_without(tmp_path: Path, missing: set[str]) -> str:
    """A PATH holding links to the shell tools and to every checked command except ``missing``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in (*SHELL_TOOLS, "mmdebstrap", "podman", "runc", "containerd", "ctr", "socat", "nft", "openssl",
                 "ip", "mount"):
        found = shutil.which(tool)
        if found and tool not in missing:
            (bindir / tool).symlink_to(found)
    return str(bindir)


def test_check_names_the_missing_package_and_why(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _path_without(tmp_path, {"containerd", "socat"})}
    res = subprocess.run(["bash", str(NODE_TOOLS), "--check"], capture_output=True, text=True, env=env)
    assert res.returncode == 1, res.stderr
    assert "command 'containerd' (Debian package containerd): the node's container runtime" in res.stderr
    assert "command 'socat' (Debian package socat)" in res.stderr
    assert "'podman'" not in res.stderr  # only what is missing
    assert res.stdout.startswith("missing: ")


def test_image_list(tmp_path: Path) -> None:
    listing = tmp_path / "images.list"
    listing.write_text("ghcr.io/disagg/disagg:0.1.0 /c/operator-1.tar\nvllm/vllm-openai:v0.33.0 /c/sim-2.tar\n\n")
    assert image_archives(listing) == {"ghcr.io/disagg/disagg:0.1.0": Path("/c/operator-1.tar"),
                                       "vllm/vllm-openai:v0.33.0": Path("/c/sim-2.tar")}
