"""Build hook of the server distribution (metadata: setup.cfg): a wheel carries the CQL
migrations of schema/ (their source of truth, in git) as app/store/cql/, where
app.store.migrations reads them when installed away from the source tree."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SCHEMA = Path(__file__).resolve().parent / "schema"


class BuildWithSchema(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads schema/ in place
            return
        target = Path(self.build_lib) / "app" / "store" / "cql"
        self.mkpath(str(target))
        for cql in sorted(SCHEMA.glob("*.cql")):
            self.copy_file(str(cql), str(target / cql.name))


setup(cmdclass={"build_py": BuildWithSchema})
