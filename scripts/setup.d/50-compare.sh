# compare-report: GNU time measures peak RSS in make bench (50-compare).
need_apt time
