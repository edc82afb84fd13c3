"""Lightning callbacks and logger factories used by ``conf/callbacks`` and ``conf/logger``."""
