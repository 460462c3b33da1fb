# PyTorch (CPU) for the example training runs and the Python probe; pip and
# wheel to build and install test wheels offline. Debian's torch lives in
# /usr/bin/python3 only.
need_apt python3 python3-torch python3-numpy python3-pip python3-wheel python3-setuptools
