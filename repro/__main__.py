from repro.cli import console

console()
