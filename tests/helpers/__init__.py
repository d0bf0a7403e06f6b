"""What the tests share, written once: paths, polling, the simulator and fleet processes, datasets,
queue decoding, Redis servers and the readers of the repository's artefacts."""
