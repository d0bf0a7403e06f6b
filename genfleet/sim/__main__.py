"""`python -m genfleet.sim --port 30000`: run a simulated SGLang server."""
import typer

from genfleet.sim.command import sim_command

if __name__ == "__main__":
    typer.run(sim_command)
