"""program.fetches: downloads that rewrite their files, what goes to rank 0 with them, reads of a
URL; program.vocab stays free of libcst (the contract imports it)."""

from __future__ import annotations

import subprocess
import sys

import libcst.matchers as m
from sdp_convert.program.fetches import fetch_unit, file_fetches, is_url, url_cache_reads, url_reads

from .helpers import code, probe

SOURCE = """\
import os
import shutil
import tarfile
import urllib.request
import zipfile

import numpy as np
import pandas as pd
import requests

BASE = "https://example.com/data"
CSV = BASE + "/a.csv"
LOCAL = "a.csv"


def fetch(root, url):
    r = requests.get(CSV)
    n = len(r.content)
    with open(LOCAL, "wb") as f:
        f.write(r.content)
    meta = requests.get(f"{BASE}/meta.json").json()
    with tarfile.open("b.tar") as tar:
        tar.extractall(root)
    z = zipfile.ZipFile("c.zip")
    z.extractall(root)
    not_an_archive.extractall(root)
    shutil.unpack_archive("d.zip", root)
    if not os.path.exists("e.bin"):
        urllib.request.urlretrieve(url, "e.bin")
    own, _ = urllib.request.urlretrieve(url)
    return meta, pd.read_csv(CSV), pd.read_csv(LOCAL), np.loadtxt(BASE + "/s.txt"), n, own
"""


def test_downloads_that_write_files_and_reads_into_memory_are_told_apart():
    t = probe(SOURCE)
    assert sorted(code(t, c.func) for c in file_fetches(t)) == [
        "requests.get", "shutil.unpack_archive", "tar.extractall", "urllib.request.urlretrieve",
        "z.extractall"]
    assert [code(t, c) for c in url_reads(t)] == [
        "pd.read_csv(CSV)", 'requests.get(f"{BASE}/meta.json")']
    assert [code(t, c) for c in url_cache_reads(t)] == ['np.loadtxt(BASE + "/s.txt")']


def test_a_url_is_a_literal_an_fstring_a_sum_or_a_name_only_assigned_one():
    t = probe(SOURCE)
    calls = m.findall(t.module, m.Call())
    first_args = {code(t, c.args[0].value): c.args[0].value for c in calls  # type: ignore[attr-defined]
                  if c.args}  # type: ignore[attr-defined]
    urls = {text: is_url(t, first_args[text], 0)
            for text in ("CSV", "LOCAL", 'f"{BASE}/meta.json"', 'BASE + "/s.txt"', "url")}
    assert urls == {"CSV": True, "LOCAL": False, 'f"{BASE}/meta.json"': True,
                    'BASE + "/s.txt"': True, "url": False}


def test_what_runs_on_rank_0_with_a_fetch():
    t = probe(SOURCE)
    fetches = {code(t, c.func): c for c in file_fetches(t)}
    response = fetch_unit(t, fetches["requests.get"])
    # From the read to the write of what it returned (``n`` is read after: no unit).
    assert response.problem is not None and "used later" in response.problem
    tar = fetch_unit(t, fetches["tar.extractall"])
    assert [code(t, s).splitlines()[0] for s in tar.statements] == [
        'with tarfile.open("b.tar") as tar:'] and tar.barrier
    retrieve = fetch_unit(t, fetches["urllib.request.urlretrieve"])
    assert [code(t, s).splitlines()[0] for s in retrieve.statements] == [
        'if not os.path.exists("e.bin"):']


def test_the_vocabulary_loads_no_libcst():
    # What a warm run reads (the cache's answers, the project facts and repairs) needs no libcst.
    done = subprocess.run(
        [sys.executable, "-c", "import sys, sdp_convert.program.vocab, sdp_convert.runner, "
         "sdp_convert.program.facts; print('libcst' in sys.modules)"],
        capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
