"""torchrun, as Debian 12 ships it (PyTorch 1.13 on Python 3.11), fails before it
starts a worker: Std.from_str finds no member for "0" because Python 3.11 stopped
listing an IntFlag's zero and multi-bit members when iterating it. This shim
replaces that one parser and then runs torchrun's own main() unchanged."""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


api.Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main

    sys.exit(main())
