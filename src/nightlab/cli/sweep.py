from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, say, with_lab


@click.command("sweep")
@click.argument("specs", nargs=-1, metavar="SPEC...")
@click.option(
    "--design",
    type=click.Choice(["full", "fractional", "random", "optuna"]),
    default="full",
    show_default=True,
    help="Full factorial, two-level fraction, random draws or an Optuna batch.",
)
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True, help="Runs per point.")
@click.option("--tier", default=None, help="Run on workers of this tier (default: fleet.default_tier).")
@click.option("-m", "--message", "description", default=None, help="What the wave tries.")
@click.option(
    "--size", type=click.IntRange(min=1), default=None, help="Runs of a random or optuna wave (default 8)."
)
@click.option(
    "--resolution",
    type=click.IntRange(min=3),
    default=None,
    help="Least resolution of a fraction (default: chosen).",
)
@click.option(
    "--levels", type=click.IntRange(min=2), default=2, show_default=True, help="Values per range (full)."
)
@click.option(
    "--sampler", type=click.Choice(["tpe", "gp"]), default="tpe", show_default=True, help="Optuna sampler."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random and optuna designs.")
@json_option
@with_lab
def command(
    lab, specs, design, repeats, tier, description, size, resolution, levels, sampler, seed, as_json
) -> None:
    """Submit one wave over search spaces, around the incumbent; prints the wave id.

    \b
    Spaces (one per knob):
      NAME=a,b,c  NAME=int(lo,hi)  NAME=uniform(lo,hi)  NAME=log(lo,hi)  NAME=pow2(lo,hi)

    A point whose files were already measured on the tier (the incumbent's own point, say)
    reuses that measurement unless --repeats asks for new ones.

    \b
    Example:
      W=$(nightlab sweep 'MATRIX_LR=log(0.01,0.08)' 'DEPTH=6,8' -m "lr x depth")
      nightlab wait --all && nightlab effects $W
    """
    from nightlab.waves import submit_sweep

    wave = submit_sweep(
        lab,
        specs,
        design=design,
        description=description,
        repeats=repeats,
        tier=tier,
        size=size,
        resolution=resolution,
        levels=levels,
        sampler=sampler,
        seed=seed,
    )
    if as_json:
        emit_json(wave.to_dict())
        return
    click.echo(wave.wave.id)
    spec = wave.wave.spec
    shape = spec["design"]["kind"] if spec.get("design") else design
    extra = f", {len(wave.reused)} reused earlier measurements" if wave.reused else ""
    say(
        f"{wave.wave.id}: {shape} design, {len(spec['runs'])} points x {repeats}, "
        f"{len(wave.experiments)} experiments queued on tier {wave.wave.tier}{extra}; "
        f"follow with `nightlab waves {wave.wave.id}`"
    )
