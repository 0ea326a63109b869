"""The ten test files whose tests took longest, summed, from pytest's junit XML:
`python benchmarks/suite_files.py /tmp/junit-LABEL.xml` (benchmarks/suite_time.sh writes it).
A session fixture's setup (the suite's one game day) is charged to the first test using it."""

import collections
import sys
import xml.etree.ElementTree as ET


def per_file(path: str) -> collections.Counter:
    totals: collections.Counter = collections.Counter()
    for case in ET.parse(path).getroot().iter("testcase"):  # noqa: S314 - pytest's own file
        name = case.get("classname", "")
        totals[name.split(".")[1] if "." in name else name] += float(case.get("time", 0))
    return totals


if __name__ == "__main__":
    totals = per_file(sys.argv[1])
    for name, seconds in totals.most_common(10):
        print(f"| {name} | {seconds:.1f} s |")
    print(f"| all tests, summed | {sum(totals.values()):.0f} s |")
