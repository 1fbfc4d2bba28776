#!/usr/bin/env bash
# Makes (once per machine) and prints the path of a virtual environment with a
# current torch from PyPI, for the Python tests' second tier: torch.compile,
# timm, transformers, diffusers, and everything else again on torch 2.x. Debian's interpreter, without
# Debian's site packages (whose torch is 1.13). PyPI's Linux torch is the CUDA
# build with NVIDIA's runtime libraries, about 4.7 GB installed; the
# environment is kept under ~/.cache (MHLA_TORCH2_ENV elsewhere) and reused
# while its pins stay the same.
set -euo pipefail

source "$(dirname "$0")/torch2_pins.sh"
env_dir=${MHLA_TORCH2_ENV:-$HOME/.cache/mhla/torch-2.11.0}
stamp="$env_dir/.mhla-pins"

if [[ ! -f "$stamp" || "$(cat "$stamp")" != "${torch2_pins[*]}" ]]; then
  echo "making the torch 2.x environment in $env_dir (a download of about 3 GB)" >&2
  rm -rf "$env_dir"
  /usr/bin/python3 -m venv "$env_dir"
  "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check "${torch2_pins[@]}" >&2
  echo "${torch2_pins[*]}" > "$stamp"
fi
# Hugging Face transformers and diffusers for mhla.transformers and
# mhla.diffusers, added to an environment already made (a small download)
# rather than making it again.
extra_pins=(transformers==5.24.0 huggingface_hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0
            diffusers==0.42.1 importlib_metadata==10.2.0)
extra_stamp="$env_dir/.mhla-extra-pins"
if [[ ! -f "$extra_stamp" || "$(cat "$extra_stamp")" != "${extra_pins[*]}" ]]; then
  "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check "${extra_pins[@]}" >&2
  echo "${extra_pins[*]}" > "$extra_stamp"
fi
echo "$env_dir"
