#!/usr/bin/env bash
# FlashAttention-4 (flash-attn-4 and its CuTe DSL) on a GPU machine that cannot reach
# PyPI, carried in two calls because its CUDA 13 library wheel is larger than one call's
# carry. Prepare on a machine with PyPI (Python 3.12 manylinux wheels, --no-deps):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
#     manylinux_2_28_x86_64 ... -d .gpu/whl flash-attn-4==4.0.0b36 nvidia-cutlass-dsl
#     nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-core nvidia-cutlass-dsl-libs-cu13
#     quack-kernels apache-tvm-ffi torch-c-dlpack-ext
#   unzip the libs-cu13 wheel, tar cJf its nvidia_cutlass_dsl/ folder, split the archive
#   in two (split -b 32000000 ... cu13.), part aa into .gpu/p1, part ab and the other
#   wheels into .gpu/p2 (.gpu/ is git-ignored; name it in the call's carry).
# On the GPU machine, in two calls made back to back (a warm machine keeps /root):
#   scripts/gpu/fa4_install.sh stage .gpu/p1
#   scripts/gpu/fa4_install.sh install .gpu/p2 && export PYTHONPATH=$(cat /tmp/fa4_path)
set -euo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
STEP=${1:?usage: fa4_install.sh stage|install DIR}
DIR=${2:?usage: fa4_install.sh stage|install DIR}
PARTS=/root/fa4parts
SITE=/tmp/site
mkdir -p "$PARTS"
cp "$DIR"/cu13.* "$PARTS"/
if [ "$STEP" = stage ]; then
  echo "fa4: staged $(ls "$PARTS" | tr '\n' ' ')"
  exit 0
fi
if [ ! -f "$PARTS/cu13.aa" ] || [ ! -f "$PARTS/cu13.ab" ]; then
  echo "fa4: a part is missing from $PARTS (the machine went cold between the calls?)" >&2
  exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$DIR"/*.whl
mkdir -p /tmp/fa4libs
cat "$PARTS"/cu13.* | tar xJf - -C /tmp/fa4libs
cp -rn /tmp/fa4libs/nvidia_cutlass_dsl "$SITE"/
echo "$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages" > /tmp/fa4_path
PYTHONPATH=$(cat /tmp/fa4_path) python3 -c "from flash_attn.cute import flash_attn_func; print('fa4: importable')"
