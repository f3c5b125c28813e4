# Finding a CPython by its version, for the scripts that build or test a
# wheel per Python (sourced):
#
#   find_python X.Y   # prints the interpreter's path (pyenv's X.Y, else
#                     # pythonX.Y on PATH), or nothing when there is none
find_python() {
  local v=$1 prefix
  if command -v pyenv >/dev/null && prefix=$(pyenv prefix "$v" 2>/dev/null) && [ -x "$prefix/bin/python$v" ]; then
    echo "$prefix/bin/python$v"
    return
  fi
  command -v "python$v" 2>/dev/null || true
}
