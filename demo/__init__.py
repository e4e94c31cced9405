"""Demo job kinds, the demo seed and the zombie drill: job code for a fresh `bin/run`.

The dashboard app only shows jobs; everything that defines, enqueues or disturbs jobs for the
demo lives here.
"""
