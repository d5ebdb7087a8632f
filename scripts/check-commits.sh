#!/usr/bin/env bash
# Checks the form of every commit message added since BASE (default: the last commit
# before the convention was adopted): a subject of at most 72 characters of the form
# `pkg: what changed` (one or more comma-separated scopes, each a package path
# with at most one more word, as in `ledger tests`, then ": "), and, when there
# is a body, a blank line between the subject and the body.
set -euo pipefail
base=${1:-01bf7fb4d978b73cefc025f7b1e880b7cbe5a86e}
cd "$(dirname "$0")/.."
if ! git cat-file -e "$base^{commit}" 2>/dev/null; then
  echo "check-commits: base commit $base is not in this clone (shallow?); fetch the full history (git fetch --unshallow) and run again" >&2
  exit 2
fi
bad=0
# a scope: a package path, optionally followed by one word ("ledger tests")
scope='[A-Za-z0-9_./{}*-]+(\ [A-Za-z0-9_./-]+)?'
while read -r sha; do
  subject=$(git log -1 --format=%s "$sha")
  second=$(git log -1 --format=%B "$sha" | sed -n 2p)
  if [ ${#subject} -gt 72 ]; then
    echo "check-commits: $sha: subject is ${#subject} characters (at most 72): $subject" >&2; bad=1
  fi
  if ! [[ $subject =~ ^$scope(,\ ?$scope)*:\ [^\ ] ]]; then
    echo "check-commits: $sha: subject is not \`pkg: what changed\`: $subject" >&2; bad=1
  fi
  if [ -n "$second" ]; then
    echo "check-commits: $sha: the second line must be blank (subject, blank line, body)" >&2; bad=1
  fi
done < <(git rev-list --no-merges "$base..HEAD")
exit $bad
