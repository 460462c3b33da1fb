# jq: the runs JSON test pipes `gpupass runs -o json` through it, as the
# README shows users doing.
need_apt jq
