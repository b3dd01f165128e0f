"""A C tool of this directory, built once for a test class (stdlib unittest): mix `CTool` in
before `unittest.TestCase` and set `SOURCE` (the .c file's name here) and `FLAGS`; the tests
run `cls.exe`."""

import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


class CTool:
    SOURCE = ""
    FLAGS = ()

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.exe = os.path.join(cls.dir, os.path.splitext(cls.SOURCE)[0])
        subprocess.run(
            ["cc", "-O2", "-Wall", "-Werror", *cls.FLAGS, "-o", cls.exe, os.path.join(HERE, cls.SOURCE)],
            check=True,
        )

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)
