# The Python module (python/): finds /usr/bin/python3 (the interpreter Debian's python3-torch is
# installed for) and pybind11, and decides STRATA_PYTHON. Included before the libraries are added,
# because a Python extension links them into a shared object: they must be position-independent.

# A pyenv or virtualenv `python3` first on PATH usually lacks torch: prefer the system one unless
# the caller names another (-DPython3_EXECUTABLE=...).
if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python interpreter the module is built for")
endif()

set(_strata_python_default OFF)
set(_strata_python_why "")
if(STRATA_SANITIZE OR STRATA_FUZZ)
  # An instrumented extension needs the sanitizer runtime preloaded into python: not supported.
  set(_strata_python_why ": sanitizer and fuzz builds leave it off")
else()
  find_package(Python3 COMPONENTS Interpreter Development)
  find_package(pybind11 CONFIG QUIET)
  if(Python3_FOUND AND pybind11_FOUND)
    set(_strata_python_default ON)
  else()
    set(_strata_python_why ": it needs pybind11 (pybind11-dev) and the Python headers (python3-dev) \
for ${Python3_EXECUTABLE}; scripts/install-deps.sh installs both")
  endif()
endif()

option(STRATA_PYTHON "Build the Python module strata._strata (python/)" ${_strata_python_default})

if(STRATA_PYTHON)
  if(NOT Python3_FOUND OR NOT pybind11_FOUND)
    message(FATAL_ERROR "STRATA_PYTHON=ON cannot be built${_strata_python_why}")
  endif()
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  message(STATUS "strata: Python module for ${Python3_EXECUTABLE} (Python ${Python3_VERSION}, "
                 "pybind11 ${pybind11_VERSION})")
else()
  message(STATUS "strata: Python module off${_strata_python_why}")
endif()
