#!/usr/bin/env bash
# The Python packages attn and its GPU checks need that the GPU machine's image lacks (datasets,
# ctranslate2, attn serve's FastAPI stack and what they need), downloaded as wheels for its Python
# 3.12 on x86-64 Linux into .whl/, at the versions installed here (the ones the tests ran with).
# .whl/ is kept out of git (.git/info/exclude); the device tool carries it (carry: [".whl"]) and
# bench/gpu_check.sh installs it there. About 55 MB, under the 64 MiB that may travel.
#
#     bash bench/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude

packages=(datasets dill multiprocess ctranslate2 fastapi starlette pydantic pydantic-core annotated-types
    typing-inspection typing-extensions opentelemetry-api uvicorn python-multipart py3langid)
pinned=$(python3 - "${packages[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        sys.exit(f"gpu_wheels: {name} is not installed here; pip install -e '.[test]' first")
EOF
)
platforms=()
for tag in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
    manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
    platforms+=(--platform "$tag")
done
rm -rf .whl
# shellcheck disable=SC2086  # one requirement per word
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl $pinned
du -sh .whl
