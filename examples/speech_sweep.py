"""A speech sweep: utterances of different lengths, decoded and turned into
log-mel features once, in one producer's DataLoader workers; trials of
different batch sizes each get every utterance once per epoch, re-padded to
the longest in their own batches. Then (unless --no-compare) the same trials
with a DataLoader each, doing the decoding and the features themselves.

    python examples/speech_sweep.py [--trials 3] [--epochs 2] [--utterances 256] [--no-compare]

The utterances are WAV files (44.1 kHz, 16-bit) written to a temporary folder
first: tones of four pitches (the label) in noise, 0.4 to 2 s long; a
worker reads one, resamples it to 16 kHz (an anti-aliasing filter, then
interpolation) and computes 40 log-mel bands every 10 ms. The
loader's collate_fn pads each loader batch to its longest utterance, with a
mask, as a collate for sequences does; a trial declares how its own batches
are re-padded: ``bc.Consumer(name, batch_size=B, pad={"features": 0.0,
"mask": 0})``. Each trial checks that it saw every utterance once per epoch,
with its frames where its mask says, and trains a small classifier.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import batchcast as bc

SOURCE_RATE = 44100  # the files'
RATE = 16000  # the features'
TAPS = 31  # the anti-aliasing filter's (short: an example)
N_FFT, HOP, MELS = 400, 160, 40  # 25 ms windows every 10 ms, 40 mel bands
CLASSES = 4
BATCH_SIZES = [8, 12, 20, 32]
LEARNING_RATES = [0.5, 0.2, 0.1, 0.05]


# ---- the data: what the producer's workers do once for every trial ----------

def seconds(index: int) -> float:
    """Length of utterance `index` (0.4 to 2 s)."""
    return 0.4 + 1.6 * ((index * 7919) % 1000) / 1000


def utterance_samples(index: int, rate: int = RATE) -> int:
    return int(rate * seconds(index))


def frames(index: int) -> int:
    """Its log-mel frames (torch.stft with center=True) at 16 kHz."""
    return 1 + resampled_length(utterance_samples(index, SOURCE_RATE)) // HOP


def resampled_length(n: int) -> int:
    return n * RATE // SOURCE_RATE


def write_wavs(folder: Path, count: int) -> None:
    g = torch.Generator().manual_seed(0)
    for i in range(count):
        n = utterance_samples(i, SOURCE_RATE)
        t = torch.arange(n) / SOURCE_RATE
        tone = torch.sin(2 * math.pi * 220 * (1 + i % CLASSES) * t)
        audio = 0.5 * tone + 0.1 * torch.randn(n, generator=g)
        pcm = (audio.clamp(-1, 1) * 32767).to(torch.int16)
        with wave.open(str(folder / f"{i:05d}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(SOURCE_RATE)
            w.writeframes(pcm.numpy().tobytes())


def mel_filterbank(bins: int, mels: int, rate: int) -> torch.Tensor:
    """Triangular filters evenly spaced on the mel scale: [mels, bins]."""
    def to_mel(hz: torch.Tensor) -> torch.Tensor:
        return 2595 * torch.log10(1 + hz / 700)

    def to_hz(mel: torch.Tensor) -> torch.Tensor:
        return 700 * (10 ** (mel / 2595) - 1)

    edges = to_hz(torch.linspace(0, float(to_mel(torch.tensor(rate / 2))), mels + 2))
    hz = torch.linspace(0, rate / 2, bins)
    lower, center, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    return torch.clamp(torch.minimum((hz - lower) / (center - lower), (upper - hz) / (upper - center)), min=0)


def lowpass(cutoff: float, taps: int) -> torch.Tensor:
    """A windowed-sinc low-pass filter (cutoff as a fraction of the sample rate)."""
    t = torch.arange(taps) - (taps - 1) / 2
    return (2 * cutoff * torch.sinc(2 * cutoff * t) * torch.hamming_window(taps, periodic=False)).view(1, 1, -1)


def resample(audio: torch.Tensor) -> torch.Tensor:
    """44.1 kHz to 16 kHz: filter below the new Nyquist frequency, then interpolate."""
    filtered = torch.nn.functional.conv1d(audio.view(1, 1, -1), FILTER, padding=TAPS // 2)
    return torch.nn.functional.interpolate(filtered, size=resampled_length(audio.numel()), mode="linear",
                                           align_corners=False).view(-1)


FILTER = lowpass(0.45 * RATE / SOURCE_RATE, TAPS)


class Utterances(Dataset):
    """Reads a WAV file, resamples it and turns it into log-mel frames:
    (features [T, 40], label, index)."""

    def __init__(self, folder: Path, count: int) -> None:
        self.folder, self.count = folder, count
        self.filters = mel_filterbank(N_FFT // 2 + 1, MELS, RATE)
        self.window = torch.hann_window(N_FFT)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        with wave.open(str(self.folder / f"{index:05d}.wav"), "rb") as w:
            pcm = torch.frombuffer(bytearray(w.readframes(w.getnframes())), dtype=torch.int16)
        audio = resample(pcm.float() / 32768)
        power = torch.stft(audio, N_FFT, HOP, window=self.window, return_complex=True).abs() ** 2
        features = torch.log(self.filters @ power + 1e-6).T.contiguous()  # [T, mels]
        return features, index % CLASSES, index


def pad_collate(samples: list[tuple[torch.Tensor, int, int]]) -> dict[str, torch.Tensor]:
    """A loader batch padded to its longest utterance, with a mask."""
    longest = max(f.shape[0] for f, _, _ in samples)
    features = torch.zeros(len(samples), longest, MELS)
    mask = torch.zeros(len(samples), longest, dtype=torch.int64)
    for r, (f, _, _) in enumerate(samples):
        features[r, :f.shape[0]] = f
        mask[r, :f.shape[0]] = 1
    return {"features": features, "mask": mask,
            "label": torch.tensor([label for _, label, _ in samples]),
            "index": torch.tensor([index for _, _, index in samples])}


def make_loader(folder: Path, args: argparse.Namespace, batch_size: int = 16) -> DataLoader:
    return DataLoader(Utterances(folder, args.utterances), batch_size=batch_size, shuffle=True,
                      num_workers=args.workers, collate_fn=pad_collate,
                      generator=torch.Generator().manual_seed(1))


# ---- a trial -------------------------------------------------------------------

def trial(params: dict[str, Any], data: str | None, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Trains a masked-mean classifier; `data` is the producer's name, or None
    for a DataLoader of its own. Checks every batch as it goes."""
    batch_size = params["batch_size"]
    # Trials share the machine's CPUs: one thread each for their small
    # steps (torch's default, a thread per core, spins against the loader's
    # workers).
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(MELS, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=params["lr"])  # (imports torch's compiler: ~1 s)
    started = time.time()  # the trial is ready: the loading it waits for, from here
    if data is not None:
        loader: Any = bc.Consumer(data, batch_size=batch_size, pad={"features": 0.0, "mask": 0})
    else:
        loader = make_loader(folder, args, batch_size)
    exact, loss = True, float("nan")
    for _ in range(args.epochs):
        seen: list[int] = []
        for batch in loader:
            features, mask = batch["features"], batch["mask"]
            lengths = mask.sum(1)
            for r, i in enumerate(batch["index"].tolist()):  # its frames where its mask says
                exact &= int(lengths[r]) == frames(i) and bool(mask[r, :frames(i)].all())
                exact &= not features[r, frames(i):].any()
            seen += batch["index"].tolist()
            pooled = (features * mask[..., None]).sum(1) / lengths[:, None]
            logits = model((pooled - pooled.mean(1, keepdim=True)) / 10)
            step = torch.nn.functional.cross_entropy(logits, batch["label"])
            optimizer.zero_grad()
            step.backward()
            optimizer.step()
            loss = float(step.detach())
        exact &= sorted(seen) == list(range(args.utterances))
    stats = loader.stats() if data is not None else {}
    if data is not None:
        loader.close()
    return {**params, "exact": exact, "loss": round(loss, 3), "repadded": stats.get("repadded", 0),
            "batches": stats.get("batches", 0), "started": started, "done": time.time()}


# ---- the sweep -----------------------------------------------------------------

def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_trials(args: argparse.Namespace, folder: Path, data: str | None) -> list[dict[str, Any]]:
    procs = []
    for k in range(args.trials):
        params = {"batch_size": BATCH_SIZES[k % len(BATCH_SIZES)], "lr": LEARNING_RATES[k % len(LEARNING_RATES)]}
        cmd = [sys.executable, __file__, "--trial", json.dumps(params), "--folder", str(folder),
               "--utterances", str(args.utterances), "--epochs", str(args.epochs),
               "--workers", str(args.workers)]
        if data is not None:
            cmd += ["--data", data]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a trial failed (exit status {p.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def sweep(args: argparse.Namespace, folder: Path, shared: bool) -> tuple[list[dict[str, Any]], float, float]:
    started, cpu = time.perf_counter(), cpu_seconds()
    if shared:
        name = f"speech-{os.getpid()}"
        with bc.Producer(make_loader(folder, args), name, epochs=args.epochs, min_consumers=args.trials):
            results = run_trials(args, folder, name)
    else:
        results = run_trials(args, folder, None)
    return results, time.perf_counter() - started, cpu_seconds() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--utterances", type=int, default=256)
    ap.add_argument("--workers", type=int, default=1, help="DataLoader workers (the producer's; each trial's when compared)")
    ap.add_argument("--no-compare", action="store_true", help="skip the run with a DataLoader per trial")
    ap.add_argument("--trial", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trial is not None:  # one trial, in its own process
        print(json.dumps(trial(json.loads(args.trial), args.data, Path(args.folder), args)))
        return

    with tempfile.TemporaryDirectory(prefix="batchcast-speech-") as tmp:
        folder = Path(tmp)
        write_wavs(folder, args.utterances)
        runs = [("one shared producer", True)] + ([] if args.no_compare else [("a DataLoader each", False)])
        for label, shared in runs:
            results, wall, cpu = sweep(args, folder, shared)
            print(f"{label}: {args.trials} trials, {args.epochs} epochs of {args.utterances} utterances: "
                  f"wall {wall:.1f} s, CPU {cpu:.1f} s")
            print(f"  {'batch':>5} {'lr':>5} {'exactly once':>12} {'re-padded':>9} {'loss':>6}")
            for r in results:
                print(f"  {r['batch_size']:>5} {r['lr']:>5} {str(r['exact']):>12} {r['repadded']:>9} {r['loss']:>6}")


if __name__ == "__main__":
    main()
